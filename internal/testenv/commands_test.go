package testenv_test

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestCommands counts a fresh client's commands: the connection handshake is left out, pipelined commands count
// one by one, round trips by shape, NOSCRIPT replies by code, and Reset starts afresh.
func TestCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := testenv.Prefix(t, testenv.Redis(t))
	rdb := redis.NewClient(testenv.Redis(t).Options()) // no connection yet
	t.Cleanup(func() { rdb.Close() })
	h := testenv.CountCommands(rdb)

	rdb.Get(ctx, p+"a") // the first command opens the connection: HELLO and CLIENT SETINFO are not counted
	if _, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, p+"a", "1", 0)
		pipe.Get(ctx, p+"a")
		pipe.Get(ctx, p+"b")
		return nil
	}); err != nil && err != redis.Nil {
		t.Fatalf("pipeline: %v", err)
	}
	rdb.EvalSha(ctx, "0000000000000000000000000000000000000000", nil) // NOSCRIPT
	rdb.ScriptLoad(ctx, "return 1")

	if got, want := h.Counts(), map[string]int64{"get": 3, "set": 1, "evalsha": 1, "script load": 1}; !maps.Equal(got, want) {
		t.Errorf("Counts() = %v, want %v", got, want)
	}
	if got, want := h.RoundTrips(), map[string]int64{"GET": 1, "SET+GET+GET": 1, "EVALSHA": 1, "SCRIPT LOAD": 1}; !maps.Equal(got, want) {
		t.Errorf("RoundTrips() = %v, want %v", got, want)
	}
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"Count(get)", h.Count("get"), 3},
		{"Trips()", h.Trips(), 4},
		{"MostInOneTrip(get)", h.MostInOneTrip("get"), 2},
		{"Errors(NOSCRIPT)", h.Errors("NOSCRIPT"), 1},
		{"Errors(ERR)", h.Errors("ERR"), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	h.Reset()
	if got := h.Counts(); len(got) != 0 || h.Trips() != 0 || h.Errors("NOSCRIPT") != 0 {
		t.Errorf("after Reset: Counts() = %v, Trips() = %d, Errors(NOSCRIPT) = %d; want all zero", got, h.Trips(), h.Errors("NOSCRIPT"))
	}
}

// TestCommandsConcurrent: many goroutines on one counted client, under -race, lose no count.
func TestCommandsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	p := testenv.Prefix(t, rdb)
	h := testenv.CountCommands(rdb)
	const goroutines, each = 16, 50
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				rdb.Incr(ctx, p+"n")
				_, _ = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
					pipe.Incr(ctx, p+"n")
					pipe.Get(ctx, p+"n")
					return nil
				})
				_ = h.Counts()
			}
		}()
	}
	wg.Wait()
	if got, want := h.Count("incr"), int64(2*goroutines*each); got != want {
		t.Errorf("Count(incr) = %d, want %d", got, want)
	}
	if got, want := h.Trips(), int64(2*goroutines*each); got != want {
		t.Errorf("Trips() = %d, want %d", got, want)
	}
	if got, want := rdb.Get(ctx, p+"n").Val(), "1600"; got != want {
		t.Errorf("the counter key = %s, want %s", got, want)
	}
}
