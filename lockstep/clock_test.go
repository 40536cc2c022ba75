package lockstep_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/lockstep"
)

// rebuildRecorder records the durations of rebuilds.
type rebuildRecorder struct {
	lockstep.NopRecorder
	mu       sync.Mutex
	rebuilds []time.Duration
}

func (r *rebuildRecorder) Rebuild(_ string, d time.Duration, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rebuilds = append(r.rebuilds, d)
}

// TestWithClock: with a fake clock that the loader moves 1.5 s forward, the rebuild time δ stored in the metadata
// hash is exactly 1500 ms and the Recorder sees exactly 1.5 s, whatever the real machine's speed.
func TestWithClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := mustKeys(t, testenv.Prefix(t, rdb), false)
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	rec := &rebuildRecorder{}
	c := newClient(t, rdb, "product", keys, func(_ context.Context, id string) ([]byte, error) {
		now.Add(int64(1500 * time.Millisecond)) // the origin "takes" 1.5 s
		return []byte("v" + id), nil
	}, time.Minute, lockstep.WithClock(clock), lockstep.WithRecorder(rec), lockstep.WithMeta(true))
	if v, err := c.Get(ctx, "1"); err != nil || string(v) != "v1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	ks, err := keys.For("1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.HGet(ctx, ks.Meta, lockstep.MetaDeltaField).Result(); err != nil || got != "1500" {
		t.Errorf("meta %s = %q, %v; want \"1500\" (ms, by the injected clock)", lockstep.MetaDeltaField, got, err)
	}
	rec.mu.Lock()
	got := rec.rebuilds
	rec.mu.Unlock()
	if len(got) != 1 || got[0] != 1500*time.Millisecond {
		t.Errorf("recorded rebuilds %v, want [1.5s]", got)
	}

	if _, err := lockstep.New(rdb, "product", keys, func(context.Context, string) ([]byte, error) { return nil, nil },
		time.Minute, lockstep.WithClock(nil)); !errors.Is(err, lockstep.ErrInvalidArgument) {
		t.Errorf("WithClock(nil): %v, want ErrInvalidArgument", err)
	}
}
