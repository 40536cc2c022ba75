package warmer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

func TestReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"pool exhausted", originReason(fmt.Errorf("keyspace %q: %w (max_conns 2)", "k", postgres.ErrPoolExhausted)), ReasonPoolExhausted},
		{"client timeout", originReason(fmt.Errorf("fetch: %w", context.DeadlineExceeded)), ReasonOriginTimeout},
		{"sql error", originReason(errors.New(`relation "items" does not exist`)), ReasonOrigin},
		{"transport", redisReason(&net.OpError{Op: "read", Err: errors.New("i/o timeout")}), ReasonTransport},
		{"closed", redisReason(redis.ErrClosed), ReasonTransport},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("reason = %q, want %q", tt.got, tt.want)
			}
		})
	}
}

type nopSource struct{}

func (nopSource) Fetch(context.Context, []string) (map[string][]byte, []string, error) {
	return nil, nil, nil
}

// A key found locked by an app is looked at again within an eighth of its lead, not after 1 s: when the app's
// rebuild fails (its origin query did) and it releases the lock, the daemon still has most of the lead to refresh.
func TestLockedKeyRecheckedWithinTheLead(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	keys, err := lockstep.NewKeys("k:${id}", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := KeyspaceConfig{Name: "k", Keys: keys, Src: nopSource{}, TTL: 10 * time.Second, RefreshAhead: 2 * time.Second,
		StatementTimeout: time.Second, PoolWaitTimeout: 500 * time.Millisecond, LockTTL: 5 * time.Second}
	w, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Config{Keyspaces: []KeyspaceConfig{cfg},
		Clock: clockwork.NewFakeClockAt(now)})
	if err != nil {
		t.Fatal(err)
	}
	k := w.keyspace("k") // never started: messages run at once in this goroutine (mailbox inactive)
	var key batchKey
	k.mail.Send(func(s *loopState) {
		s.setHot(map[string]bool{"1": true})
		h := s.hotSet["1"]
		h.expiry = now.Add(2 * time.Second)
		key = s.batchKeys([]*hotState{h})[0]
	})
	k.settle(k.newPipeline(k.config(), nil), []*item{{id: "1", hot: key, result: ResultLocked}}, nil)
	k.mail.Send(func(s *loopState) {
		h := s.hotSet["1"]
		if lead, got := s.lead(h), h.due.Sub(now); got <= 0 || got > lead/8 {
			t.Errorf("locked key due again in %v, want within lead/8 = %v", got, lead/8)
		}
	})
}
