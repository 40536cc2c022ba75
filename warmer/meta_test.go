package warmer_test

import (
	"context"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestKeepMeta: by default the daemon writes the value alone (no meta hash beside it); with KeepMeta it writes the
// meta hash with the value's TTL, as lockstep's meta mode does.
func TestKeepMeta(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "keep_meta"}[keep], func(t *testing.T) {
			_, rdb, cfg, _ := reconcileSetup(t, 3, time.Minute)
			cfg.KeepMeta = keep
			start(t, rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
			ctx := context.Background()
			ks, err := cfg.Keys.For("1")
			if err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 10*time.Second, "value written", func() bool { return rdb.Exists(ctx, ks.Cache).Val() == 1 })
			if got := rdb.Exists(ctx, ks.Meta).Val() == 1; got != keep {
				t.Errorf("meta hash exists = %v, want %v", got, keep)
			}
		})
	}
}
