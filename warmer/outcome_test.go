package warmer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/sources/postgres"
)

func TestReasons(t *testing.T) {
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
