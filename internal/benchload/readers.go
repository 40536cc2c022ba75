package benchload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

// Readers configures StartReaders.
type Readers struct {
	Workers int     // concurrent readers, each with its own lockstep client per keyspace (one app process each)
	Zipf    float64 // Zipf exponent s (> 1) of the id popularity
	Sample  float64 // the clients' access-recording sample rate, in (0, 1]
	Seed    uint64  // seeds each reader's Zipf draw, with the reader's number
}

// StartReaders starts r.Workers readers on wg, each with its own lockstep client per keyspace and its own Zipf
// draw (seeded from r.Seed and its number), reading the spaces in turn until ctx ends. Reads after warmEnd count
// per id; hot says whether an id was hot at the moment of a read. It returns the clients, which the caller closes
// after wg.Wait, and the first error setting them up (the readers started before it run on).
func StartReaders(ctx context.Context, wg *sync.WaitGroup, rdb redis.UniversalClient, spaces []*Space, r Readers,
	warmEnd time.Time, hot func(ks, id string) bool) ([]*lockstep.Client, error) {
	var clients []*lockstep.Client
	for w := 0; w < r.Workers; w++ {
		wk := &reader{r: rand.New(rand.NewPCG(r.Seed, uint64(w)))}
		cs := make([]*lockstep.Client, len(spaces))
		for i, ls := range spaces {
			c, err := ls.client(rdb, wk, r.Sample)
			if err != nil {
				return clients, err
			}
			cs[i] = c
			clients = append(clients, c)
		}
		zipfs := make([]*rand.Zipf, len(spaces))
		for i, ls := range spaces {
			zipfs[i] = rand.NewZipf(wk.r, r.Zipf, 1, uint64(len(ls.IDs)-1))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				i := n % len(spaces)
				ls := spaces[i]
				id := ls.IDs[zipfs[i].Uint64()]
				wk.outcome = outcomeHit
				t0 := time.Now()
				_, err := cs[i].Get(ctx, id)
				lat := time.Since(t0)
				if ctx.Err() != nil {
					return
				}
				ls.record(id, wk.outcome, lat, err, t0.After(warmEnd), hot(ls.Name, id))
			}
		}()
	}
	return clients, nil
}

// Outcomes of one Get, as the reader's recorder saw them.
const (
	outcomeHit = iota
	outcomeMiss
	outcomeStale
)

// reader is one reader goroutine; its recorder sees only its own Gets, so it can tell each Get's outcome.
type reader struct {
	r       *rand.Rand
	outcome int
}

// readerRecorder is a lockstep.Recorder that marks the current Get's outcome on its reader.
type readerRecorder struct {
	lockstep.NopRecorder
	w  *reader
	ls *Space
}

func (r readerRecorder) Miss(string) {
	if r.w.outcome == outcomeHit {
		r.w.outcome = outcomeMiss
	}
}
func (r readerRecorder) StaleServe(string) { r.w.outcome = outcomeStale }
func (r readerRecorder) Rebuild(_ string, _ time.Duration, result string) {
	if result == lockstep.ResultOK {
		r.ls.appRebuilds.Add(1)
	}
}

// Space is one keyspace under load, with what its reads saw. Its counters are safe for concurrent use; read
// them with Stats.
type Space struct {
	Name     string
	Keyspace *config.Keyspace
	IDs      []string // every id of the keyspace's ids_query, shuffled (popularity follows this order)
	// MaxLatencies keeps at most this many read latencies (0: all), to bound a long run's memory. Set it before
	// the readers start.
	MaxLatencies int

	src *postgres.Source

	mu        sync.Mutex // guards the fields below
	stats     Stats
	perID     map[string]*IDStats
	latencies []time.Duration

	appRebuilds atomic.Int64
}

// Stats is what a Space's reads saw.
type Stats struct {
	Reads, Hits int
	Misses      int // misses, stale serves included
	Stale       int // stale serves
	Errors      int // failed reads (lockstep.ErrNotFound is not a failure)
	FirstErr    error
	Latencies   []time.Duration // sorted, at most Space.MaxLatencies
	// LiveHotReads and LiveHotMisses count the reads (and misses) after the warm-up of ids that were hot at the
	// moment of the read.
	LiveHotReads, LiveHotMisses int
	PerID                       map[string]IDStats // reads and misses after the warm-up, by id
	AppRebuilds                 int64              // values the readers' clients rebuilt themselves
}

// IDStats counts one id's reads and misses after the warm-up.
type IDStats struct{ Reads, Misses int }

// NewSpace lists the keyspace's ids through src (its ids_query) and shuffles them with seed, so that popularity is
// not tied to id order (which the daemon must not rely on). A keyspace with fewer than 2 ids is an error.
func NewSpace(ctx context.Context, ks *config.Keyspace, src *postgres.Source, seed uint64) (*Space, error) {
	ls := &Space{Name: ks.Name, Keyspace: ks, src: src, perID: map[string]*IDStats{}}
	err := src.IDs(ctx, func(id string) error {
		ls.IDs = append(ls.IDs, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(ls.IDs) < 2 {
		return nil, fmt.Errorf("keyspace %q: ids_query returned %d ids; need at least 2", ks.Name, len(ls.IDs))
	}
	r := rand.New(rand.NewPCG(seed, 99))
	r.Shuffle(len(ls.IDs), func(i, j int) { ls.IDs[i], ls.IDs[j] = ls.IDs[j], ls.IDs[i] })
	return ls, nil
}

func (ls *Space) client(rdb redis.UniversalClient, w *reader, sample float64) (*lockstep.Client, error) {
	ks := ls.Keyspace
	opts := []lockstep.Option{
		lockstep.WithJitter(ks.Jitter),
		lockstep.WithLockTTL(ks.LockTTL),
		lockstep.WithAccessRecording(sample),
		lockstep.WithRecorder(readerRecorder{w: w, ls: ls}),
		lockstep.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if ks.StaleTTL > 0 && !ks.Keys().Stale.IsZero() {
		opts = append(opts, lockstep.WithStale(ks.StaleTTL))
	}
	return lockstep.New(rdb, ls.Name, ks.Keys(), LoaderOf(ls.src), ks.TTL, opts...)
}

// record counts one read. hotNow says whether the id was hot when it was read.
func (ls *Space) record(id string, outcome int, lat time.Duration, err error, afterWarmup, hotNow bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	st := &ls.stats
	st.Reads++
	if ls.MaxLatencies == 0 || len(ls.latencies) < ls.MaxLatencies {
		ls.latencies = append(ls.latencies, lat)
	}
	if err != nil && !errors.Is(err, lockstep.ErrNotFound) {
		st.Errors++
		if st.FirstErr == nil {
			st.FirstErr = err
		}
	}
	switch outcome {
	case outcomeHit:
		st.Hits++
	case outcomeMiss:
		st.Misses++
	case outcomeStale:
		st.Misses++
		st.Stale++
	}
	if afterWarmup {
		s := ls.perID[id]
		if s == nil {
			s = &IDStats{}
			ls.perID[id] = s
		}
		s.Reads++
		if outcome != outcomeHit {
			s.Misses++
		}
		if hotNow {
			st.LiveHotReads++
			if outcome != outcomeHit {
				st.LiveHotMisses++
			}
		}
	}
}

// Stats returns a copy of what the reads saw so far.
func (ls *Space) Stats() Stats {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	st := ls.stats
	st.Latencies = slices.Clone(ls.latencies)
	slices.Sort(st.Latencies)
	st.PerID = make(map[string]IDStats, len(ls.perID))
	for id, s := range ls.perID {
		st.PerID[id] = *s
	}
	st.AppRebuilds = ls.appRebuilds.Load()
	return st
}

// TopRead returns the n most-read ids after the warm-up.
func (ls *Space) TopRead(n int) map[string]bool {
	ls.mu.Lock()
	type kv struct {
		id string
		n  int
	}
	all := make([]kv, 0, len(ls.perID))
	for id, s := range ls.perID {
		all = append(all, kv{id, s.Reads})
	}
	ls.mu.Unlock()
	slices.SortFunc(all, func(a, b kv) int { return b.n - a.n })
	out := map[string]bool{}
	for i := 0; i < len(all) && i < n; i++ {
		out[all[i].id] = true
	}
	return out
}

// DaemonStatus reads the daemon's /debug/hotkeys?limit=0 at addr (host:port) in full: every keyspace's hot set.
// It returns nil when addr is "" or the daemon does not answer with 200 and valid JSON within timeout.
func DaemonStatus(addr string, timeout time.Duration) []warmer.KeyspaceStatus {
	if addr == "" {
		return nil
	}
	c := http.Client{Timeout: timeout}
	resp, err := c.Get("http://" + addr + "/debug/hotkeys?limit=0")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st []warmer.KeyspaceStatus
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	return st
}
