package warmer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// BenchmarkPollPinned measures one access-signal poll of a keyspace of 100,000 pinned ids (top_n 0) once its hot
// set is known: the work each replica repeats every poll_interval. Run against the shared Redis (the poll's
// decay lease is its only command here), on a keyspace that is never started, so that the poll runs in the
// benchmark's goroutine. docs/benchmarks.md §14 compares it before and after the pinned-only poll kept its hot
// set between polls.
func BenchmarkPollPinned(b *testing.B) {
	rdb := testenv.Redis(b)
	keys, err := lockstep.NewKeys(testenv.Prefix(b, rdb)+"p:${id}", "", "", "")
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	cfg := KeyspaceConfig{Name: "p", Keys: keys, Src: nopSource{}, TTL: time.Minute, Pinned: ids}
	w, err := New(rdb, Config{Keyspaces: []KeyspaceConfig{cfg}})
	if err != nil {
		b.Fatal(err)
	}
	k := w.keyspace("p") // never started: messages run at once in this goroutine
	ctx := context.Background()
	k.mail.Send(func(s *loopState) { s.poll(ctx) }) // the first poll selects the hot set
	b.ResetTimer()
	for range b.N {
		k.mail.Send(func(s *loopState) { s.poll(ctx) })
	}
	b.StopTimer()
	k.mail.Send(func(s *loopState) {
		if len(s.hotSet) != len(ids) {
			b.Fatalf("hot set of %d, want the %d pinned ids", len(s.hotSet), len(ids))
		}
	})
}
