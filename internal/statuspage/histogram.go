package statuspage

import (
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// Geometry of the histogram's SVG, in user units.
const (
	histW, histH = 600.0, 120.0 // plot area
	histLeft     = 36.0         // room for the count labels
	histBottom   = 20.0         // room for the time labels
)

// histogram is an SVG bar chart of the hot keys' TTL left: how many keys expire in each slice of time from now.
// Keys written together with jitter spread over several bars; keys that bunch up make one tall bar.
type histogram struct {
	Bars          []bar
	Ticks         []tick
	Max           int // the tallest bar's count
	Keys          int // keys with a known TTL
	Unknown       int // hot keys with no known expiry (missing at the origin, persistent, not yet seen)
	Width, Height float64
	Left, PlotH   float64
	Span          string
}

type bar struct {
	X, Y, W, H float64
	N          int
	From, To   string
}

type tick struct {
	X     float64
	Label string
}

// newHistogram counts keys into bins equal slices of [0, span), span being the largest TTL left rounded up to a
// round number.
func newHistogram(keys []warmer.KeyStatus, bins int) histogram {
	h := histogram{Width: histLeft + histW + 24, Height: histH + histBottom, Left: histLeft, PlotH: histH}
	var longest time.Duration
	for _, k := range keys {
		if k.TTL <= 0 {
			h.Unknown++
			continue
		}
		h.Keys++
		longest = max(longest, k.TTL)
	}
	if h.Keys == 0 {
		return h
	}
	span := roundUp(longest)
	h.Span = short(span)
	counts := make([]int, bins)
	for _, k := range keys {
		if k.TTL <= 0 {
			continue
		}
		i := min(int(int64(k.TTL)*int64(bins)/int64(span)), bins-1)
		counts[i]++
	}
	for _, n := range counts {
		h.Max = max(h.Max, n)
	}
	w := histW / float64(bins)
	step := span / time.Duration(bins)
	for i, n := range counts {
		if n == 0 {
			continue
		}
		bh := histH * float64(n) / float64(h.Max)
		h.Bars = append(h.Bars, bar{X: histLeft + float64(i)*w + 1, Y: histH - bh, W: w - 2, H: bh, N: n,
			From: short(step * time.Duration(i)), To: short(step * time.Duration(i+1))})
	}
	for i := 0; i <= 4; i++ {
		label := "now"
		if i > 0 {
			label = "+" + short(span*time.Duration(i)/4)
		}
		h.Ticks = append(h.Ticks, tick{X: histLeft + histW*float64(i)/4, Label: label})
	}
	return h
}

// roundUp returns the smallest of 1, 2 or 5 times a power of ten milliseconds (or 15 s, 30 s, 1 m, 2 m, 5 m, 10 m,
// 15 m, 30 m, 1 h and whole hours) that is ≥ d.
func roundUp(d time.Duration) time.Duration {
	steps := []time.Duration{}
	for ms := time.Millisecond; ms < 10*time.Second; ms *= 10 {
		steps = append(steps, ms, 2*ms, 5*ms)
	}
	steps = append(steps, 10*time.Second, 15*time.Second, 30*time.Second, time.Minute, 2*time.Minute,
		5*time.Minute, 10*time.Minute, 15*time.Minute, 30*time.Minute, time.Hour)
	for _, s := range steps {
		if d <= s {
			return s
		}
	}
	return (d + time.Hour - 1).Truncate(time.Hour)
}
