package benchload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
)

// Updates configures RunUpdates.
type Updates struct {
	Rate        float64       // track row updates per second
	Duration    time.Duration // how long to update
	Workers     int           // connections issuing updates
	SampleEvery int           // time the landing in Redis of every Nth update of a cached track (0: none)
	MoveEvery   int           // every Nth update also moves the track to another album (0: never)
	Zipf        float64       // Zipf exponent (> 1) of the updated track ids
	Hook        UpdateHook    // optional: watches each update (the soak's freshness observer)
}

// UpdateHook watches each row update of RunUpdates.
type UpdateHook interface {
	// Before runs just before update seq of track id (to name, moving it to album moveTo, 0: no move) is sent;
	// it returns the function the worker calls with the moment the update returned and its error.
	Before(ctx context.Context, seq int64, id int, name string, moveTo int) func(committed time.Time, err error)
	// ForceMove reports whether the next update should move its track whatever MoveEvery says.
	ForceMove() bool
}

// UpdateReport is what RunUpdates measured and, for `keepwarm-bench changes`, what it verified; its JSON is the
// changes benchmark's --json output.
type UpdateReport struct {
	Rate, Achieved  float64
	Duration        time.Duration
	Updates, Errors int64
	Samples         int64 // updates of a cached track whose landing in Redis was timed
	// Landed: samples whose key stopped serving the old value within 5 s (the new value, a later one, or the key
	// gone: expired or invalidated, which is not stale either); Absent: of those, the ones that went absent;
	// Lost: samples whose key still held the old value after 5 s.
	Landed, Absent, Lost int64
	P50, P99, Max        time.Duration
	Windows              []UpdateWindow
	Metrics              map[string]float64 // daemon metric deltas over the run
	Mismatches           int
	Checked              int
	MismatchExamples     []string
}

// UpdateWindow is the commit-to-Redis latency of the samples committed in one 5 s window.
type UpdateWindow struct {
	At       float64 // seconds into the run (window end)
	P50, P99 float64 // milliseconds
	N        int
}

// RunUpdates updates rows of cfg's track table through pool at u.Rate per second for u.Duration (single-row
// transactions, names "kwb <seq>", ids Zipf-distributed), timing how long a sample of them takes to land in
// Redis (the track keyspace's cache key no longer holding the old name), and fills rep's Rate, Achieved,
// Duration, Updates, Errors, Samples, Landed, Absent, Lost, P50, P99, Max and Windows. It writes one summary
// line to stderr. It returns an error only when it cannot count the tracks and albums; failed updates are counted.
func RunUpdates(ctx context.Context, u Updates, cfg *config.Config, rdb redis.UniversalClient, pool *pgxpool.Pool,
	rep *UpdateReport, stderr io.Writer) error {
	var ntracks, nalbums int
	if err := pool.QueryRow(ctx, "select (select count(*) from track), (select count(*) from album)").Scan(&ntracks, &nalbums); err != nil {
		return fmt.Errorf("count tracks: %w", err)
	}
	trackKeys := cfg.Keyspace("track").Keys()
	rctx, cancel := context.WithTimeout(ctx, u.Duration)
	defer cancel()
	type sample struct {
		at  float64
		lat time.Duration
	}
	var mu sync.Mutex
	var samples []sample
	var updates, errs, nsamples, landed, lost, absent atomic.Int64
	jobs := make(chan int64, u.Workers*4)
	start := time.Now()
	var wg sync.WaitGroup
	var timers sync.WaitGroup
	for w := 0; w < u.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			z := rand.NewZipf(r, u.Zipf, 1, uint64(ntracks-1))
			for seq := range jobs {
				id := int(z.Uint64()) + 1
				name := fmt.Sprintf("kwb %d", seq)
				q, qargs := "update track set name = $2 where track_id = $1", []any{id, name}
				moveTo := 0
				if u.MoveEvery > 0 && seq%int64(u.MoveEvery) == 0 || u.Hook != nil && u.Hook.ForceMove() {
					moveTo = r.IntN(nalbums) + 1
					q, qargs = "update track set name = $2, album_id = $3 where track_id = $1", []any{id, name, moveTo}
				}
				timed := u.SampleEvery > 0 && seq%int64(u.SampleEvery) == 0
				var key string
				if timed {
					ks, _ := trackKeys.For(strconv.Itoa(id))
					key = ks.Cache
					if n, err := rdb.Exists(rctx, key).Result(); err != nil || n == 0 {
						timed = false // not cached: nothing to land
					}
				}
				var done func(time.Time, error)
				if u.Hook != nil {
					done = u.Hook.Before(rctx, seq, id, name, moveTo)
				}
				_, err := pool.Exec(rctx, q, qargs...)
				committed := time.Now()
				if done != nil {
					done(committed, err)
				}
				if err != nil {
					if rctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				updates.Add(1)
				if !timed {
					continue
				}
				nsamples.Add(1)
				timers.Add(1)
				go func() {
					defer timers.Done()
					want := []byte(`"name" : "` + name + `"`)
					deadline := committed.Add(5 * time.Second)
					for time.Now().Before(deadline) {
						v, err := rdb.Get(context.Background(), key).Bytes()
						// Our name, or a later update's of the same id (which superseded ours), has landed; a key
						// gone no longer serves the old value either (the next read rebuilds it from the row).
						gone := errors.Is(err, redis.Nil)
						if gone || (err == nil && (bytes.Contains(v, want) || newer(v, name))) {
							landed.Add(1)
							if gone {
								absent.Add(1)
							}
							mu.Lock()
							samples = append(samples, sample{at: committed.Sub(start).Seconds(), lat: time.Since(committed)})
							mu.Unlock()
							return
						}
						time.Sleep(2 * time.Millisecond)
					}
					lost.Add(1)
				}()
			}
		}()
	}
	interval := 10 * time.Millisecond
	perTick := u.Rate * interval.Seconds()
	t := time.NewTicker(interval)
	var seq int64
	owed := 0.0
	last := time.Now()
loop:
	for {
		select {
		case <-rctx.Done():
			break loop
		case now := <-t.C:
			owed += perTick * float64(now.Sub(last)) / float64(interval)
			last = now
			for ; owed >= 1; owed-- {
				seq++
				select {
				case jobs <- seq:
				case <-rctx.Done():
					break loop
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	timers.Wait()
	rep.Rate, rep.Duration = u.Rate, elapsed
	rep.Updates, rep.Errors = updates.Load(), errs.Load()
	rep.Achieved = float64(rep.Updates) / elapsed.Seconds()
	rep.Samples, rep.Landed, rep.Lost, rep.Absent = nsamples.Load(), landed.Load(), lost.Load(), absent.Load()
	slices.SortFunc(samples, func(a, b sample) int { return int(a.at*1e6 - b.at*1e6) })
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s.lat)
	}
	rep.P50, rep.P99, rep.Max = Percentile(all, 0.5), Percentile(all, 0.99), Percentile(all, 1)
	const win = 5.0
	for w0 := 0.0; w0 < elapsed.Seconds(); w0 += win {
		var lats []time.Duration
		for _, s := range samples {
			if s.at >= w0 && s.at < w0+win {
				lats = append(lats, s.lat)
			}
		}
		if len(lats) > 0 {
			rep.Windows = append(rep.Windows, UpdateWindow{At: w0 + win, N: len(lats),
				P50: ms(Percentile(lats, 0.5)), P99: ms(Percentile(lats, 0.99))})
		}
	}
	fmt.Fprintf(stderr, "changes: %d updates in %v (%.0f/s), %d errors\n", rep.Updates, elapsed.Round(time.Second), rep.Achieved, rep.Errors)
	return nil
}

// newer reports whether v holds a "kwb N" name with N > the sequence number in name.
func newer(v []byte, name string) bool {
	mine, _ := strconv.ParseInt(strings.TrimPrefix(name, "kwb "), 10, 64)
	i := bytes.Index(v, []byte(`"name" : "kwb `))
	if i < 0 {
		return false
	}
	rest := v[i+len(`"name" : "kwb `):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return false
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return err == nil && n > mine
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
