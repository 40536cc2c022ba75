package warmer

import (
	"hash/maphash"
	"math"
	"math/bits"
	"time"
)

// The long memory of the hot-key selection.
//
// A tracked entry forgets: its access score halves every decay_half_life, and when the tracked set is full the
// coldest entries leave it, history and all. Ids re-read at gaps longer than a few half-lives (on disk-like
// traces, most re-reads of the top ids come 7–100 s apart at a 33 s half-life) then lose their admission and their
// rank between reads, and start again from nothing at every read. The frequency sketch keeps their reads apart
// from the entries, in memory fixed at construction, so that trimming an entry cannot erase them and they age
// on a longer horizon (history_half_life) than the entries' scores.
//
// It is a count-min sketch (Cormode and Muthukrishnan, "An Improved Data Stream Summary: The Count-Min Sketch and
// its Applications", J. Algorithms 2005) with conservative update (Estan and Varghese, SIGCOMM 2002), aged by
// halving every counter once per history_half_life: TinyLFU's reset (Einziger, Friedman and Manes, "TinyLFU: A
// Highly Efficient Cache Admission Policy", ACM ToS 2017), on a clock instead of a sample count because the
// daemon sees signals per poll, not reads. Caffeine's FrequencySketch is the same structure with 4-bit counters;
// these are 8-bit, because ids read more than 15 times per horizon must still be told apart.

// sketchDepth is the number of rows (hash functions). Four is TinyLFU's and Caffeine's choice.
const sketchDepth = 4

// sketchWidthPerID is the counters per row per tracked id, before the width is rounded up to a power of two: 4
// rows × 2 × 1 byte is 8 to 16 bytes per tracked id, inside the 200 B per tracked id bound, and keeps a full
// table's false "read before" answers for an id never seen (every row's counter non-zero) small
// (TestSketchNeverUnderestimates: under 5% with 100,000 adds into a sketch for 10,000 ids).
const sketchWidthPerID = 2

// frequencySketch estimates, per id, the reads the signals showed, aged by halving every counter once per
// half-life. It is not safe for concurrent use: the keyspace loop owns it with the tracker.
type frequencySketch struct {
	table    []uint8 // sketchDepth rows of width counters, row-major
	mask     uint64  // width − 1
	seed     maphash.Seed
	halfLife time.Duration
	halvedAt int64 // unix seconds of the last halving
}

// newFrequencySketch returns a sketch sized for maxTracked ids (8 to 16 bytes per id, at least 4 KiB), ageing
// with the given half-life, its clock started at unix second now.
func newFrequencySketch(maxTracked int, halfLife time.Duration, now int64) *frequencySketch {
	width := sketchWidth(maxTracked)
	return &frequencySketch{
		table:    make([]uint8, sketchDepth*width),
		mask:     width - 1,
		seed:     maphash.MakeSeed(),
		halfLife: halfLife,
		halvedAt: now,
	}
}

// sketchWidth is the counters per row of a sketch for maxTracked ids: sketchWidthPerID per id, rounded up to a
// power of two, at least 1024.
func sketchWidth(maxTracked int) uint64 {
	return uint64(1) << bits.Len64(uint64(max(maxTracked*sketchWidthPerID, 1024))-1)
}

// bytes is the sketch's table size, for the memory bound.
func (s *frequencySketch) bytes() int { return len(s.table) }

// index returns the counter of id in each row (double hashing: row i uses h1 + i·h2, Kirsch and Mitzenmacher,
// "Less Hashing, Same Performance", ESA 2006).
func (s *frequencySketch) index(id string) [sketchDepth]uint64 {
	h := maphash.String(s.seed, id)
	h1, h2 := h, h>>32|1
	width := s.mask + 1
	var idx [sketchDepth]uint64
	for i := range idx {
		idx[i] = uint64(i)*width + (h1+uint64(i)*h2)&s.mask
	}
	return idx
}

// add counts n reads of id (saturating at 255). Conservative update raises only the counters that were at the
// id's estimate, so ids sharing a counter inflate each other less.
func (s *frequencySketch) add(id string, n int) {
	if n <= 0 {
		return
	}
	idx := s.index(id)
	est := s.min(idx)
	target := uint8(min(int(est)+n, math.MaxUint8))
	for _, i := range idx {
		if s.table[i] < target {
			s.table[i] = target
		}
	}
}

// estimate returns id's aged read count: never below the true count since the last halvings (up to the 255 a
// counter saturates at), above it by what colliding ids added.
func (s *frequencySketch) estimate(id string) uint8 { return s.min(s.index(id)) }

func (s *frequencySketch) min(idx [sketchDepth]uint64) uint8 {
	m := uint8(math.MaxUint8)
	for _, i := range idx {
		m = min(m, s.table[i])
	}
	return m
}

// period is the half-life in whole seconds (the tracker's clock), rounded, at least 1.
func (s *frequencySketch) period() int64 {
	return max(1, int64((s.halfLife+time.Second/2)/time.Second))
}

// age halves every counter once for each full half-life since the last halving, as of unix second now.
func (s *frequencySketch) age(now int64) {
	hl := s.period()
	if now-s.halvedAt < hl {
		return
	}
	shift := min((now-s.halvedAt)/hl, 8)
	for i, c := range s.table {
		s.table[i] = c >> shift
	}
	s.halvedAt += (now - s.halvedAt) / hl * hl
}

// rate converts id's estimate into the scale of an access score at decay half-life decay, at unix second now:
// a steady λ reads/s gives an access score of λ·decay/ln 2, and a count that halves every h in steps, faded
// by the time since the last halving, holds about λ·h; so the estimate is scaled by decay/(h·ln 2) and that fade.
func (s *frequencySketch) rate(id string, now int64, decay time.Duration) float64 {
	c := s.estimate(id)
	if c == 0 {
		return 0
	}
	hl := float64(s.period())
	return float64(c) * math.Exp2(-float64(now-s.halvedAt)/hl) * decay.Seconds() / (hl * math.Ln2)
}
