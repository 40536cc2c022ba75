package warmer

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// lfuScanCount is the default of KeyspaceConfig.LFUScanCount, how many keys one poll asks SCAN for: the LFU
// signal is rate-limited to this per poll interval, so it never competes with the application's traffic.
const lfuScanCount = 1000

// lfuState is where the incremental SCAN of a keyspace's pattern stands.
type lfuState struct {
	enabled bool
	cursor  uint64
}

// checkLFU turns the LFU signal on when the keyspace asks for it and Redis's maxmemory-policy is an LFU policy;
// OBJECT FREQ answers only then. Otherwise it says so in the log.
func (k *keyspace) checkLFU(ctx context.Context) {
	cfg := k.config()
	if !cfg.LFU {
		return
	}
	res, err := k.w.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	policy := res["maxmemory-policy"]
	enabled := err == nil && strings.Contains(policy, "lfu")
	k.mu.Lock()
	k.lfu.enabled = enabled
	k.mu.Unlock()
	switch {
	case err != nil:
		k.log.Warn("lfu signal off: cannot read maxmemory-policy", "error", err)
	case !enabled:
		k.log.Info("lfu signal off: Redis maxmemory-policy is not an LFU policy", "maxmemory_policy", policy)
	default:
		k.log.Info("lfu signal on", "maxmemory_policy", policy)
	}
}

// scanLFU advances the SCAN of the keyspace's key pattern by one step and returns the OBJECT FREQ counter
// (Redis's logarithmic access counter, 0..255) of each id found.
func (k *keyspace) scanLFU(ctx context.Context, cfg KeyspaceConfig) map[string]uint8 {
	k.mu.Lock()
	st := k.lfu
	k.mu.Unlock()
	if !st.enabled {
		return nil
	}
	m := k.match
	if m == nil {
		return nil
	}
	keys, cursor, err := k.w.rdb.Scan(ctx, st.cursor, m.pattern(), int64(cfg.LFUScanCount)).Result()
	if err != nil {
		k.redisError(ctx, "scan for lfu", err)
		return nil
	}
	k.mu.Lock()
	k.lfu.cursor = cursor
	k.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	pipe := k.w.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, key := range keys {
		cmds[i] = pipe.ObjectFreq(ctx, key)
	}
	_, _ = pipe.Exec(ctx)
	out := make(map[string]uint8, len(keys))
	for i, key := range keys {
		f, err := cmds[i].Result()
		if err != nil {
			continue
		}
		if id, ok := m.id(key); ok {
			out[id] = uint8(min(f, 255))
		}
	}
	return out
}

// matcher maps cache keys back to ids for a template with exactly one ${id}: "track:${id}" matches
// "track:42" as id "42".
type matcher struct{ prefix, suffix string }

func newMatcher(template string) *matcher {
	if strings.Count(template, "${id}") != 1 {
		return nil
	}
	i := strings.Index(template, "${id}")
	return &matcher{prefix: template[:i], suffix: template[i+len("${id}"):]}
}

func (m *matcher) id(key string) (string, bool) {
	if len(key) <= len(m.prefix)+len(m.suffix) || !strings.HasPrefix(key, m.prefix) || !strings.HasSuffix(key, m.suffix) {
		return "", false
	}
	return key[len(m.prefix) : len(key)-len(m.suffix)], true
}

// pattern is the SCAN MATCH glob of the template, with glob metacharacters in its literal parts escaped.
func (m *matcher) pattern() string {
	esc := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return esc.Replace(m.prefix) + "*" + esc.Replace(m.suffix)
}
