package backoff_test

import (
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

func TestDelay(t *testing.T) {
	const base, maxDelay = time.Second, time.Minute
	tests := []struct {
		name      string
		attempt   int
		u         float64
		want      time.Duration
		wantRange [2]time.Duration // when want is 0: [lo, hi)
	}{
		{name: "first retry, lowest draw", attempt: 0, u: 0, want: 500 * time.Millisecond},
		{name: "first retry, middle draw", attempt: 0, u: 0.5, want: 750 * time.Millisecond},
		{name: "third retry doubles twice", attempt: 2, u: 0, want: 2 * time.Second},
		{name: "capped", attempt: 10, u: 0, want: 30 * time.Second},
		{name: "capped, highest draw", attempt: 10, u: 0.999999, wantRange: [2]time.Duration{59 * time.Second, time.Minute}},
		{name: "huge attempt does not overflow", attempt: 1 << 20, u: 0, want: 30 * time.Second},
		{name: "attempt 63 does not overflow", attempt: 63, u: 0, want: 30 * time.Second},
		{name: "negative attempt is the first", attempt: -3, u: 0, want: 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := backoff.Delay(tt.attempt, base, maxDelay, tt.u)
			if tt.want != 0 {
				if got != tt.want {
					t.Errorf("Delay(%d, %v, %v, %v) = %v, want %v", tt.attempt, base, maxDelay, tt.u, got, tt.want)
				}
				return
			}
			if got < tt.wantRange[0] || got >= tt.wantRange[1] {
				t.Errorf("Delay(%d, %v, %v, %v) = %v, want in [%v, %v)", tt.attempt, base, maxDelay, tt.u, got,
					tt.wantRange[0], tt.wantRange[1])
			}
		})
	}
}
