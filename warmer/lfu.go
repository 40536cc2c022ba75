package warmer

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// lfuScanCount is the default of KeyspaceConfig.LFUScanCount, how many keys one poll asks SCAN for: the LFU
// signal is rate-limited to this per poll interval, so it never competes with the application's traffic.
const lfuScanCount = 1000

// lfuInitVal is Redis's LFU_INIT_VAL (src/server.h): createObject (src/object.c) starts every new key's LFU
// counter at 5, "in order to give new objects a chance to accumulate hits" (redis.conf, LFU section), and
// LFULogIncr (src/evict.c) counts hits only above it. A counter at or below it is therefore no evidence of
// access: a key written by a warmup and never read shows 5, and idle keys decay towards 0. Only the part above
// it is the LFU signal, so fresh keys never outrank ids with measured access.
// See https://redis.io/docs/latest/develop/reference/eviction/#the-new-lfu-mode.
const lfuInitVal = 5

// lfuState is where the LFU signal and the incremental SCAN of a keyspace's pattern stand.
type lfuState struct {
	enabled bool      // the keyspace asks for LFU and maxmemory-policy was an LFU policy at the last check
	want    bool      // KeyspaceConfig.LFU at the last check
	checked time.Time // when maxmemory-policy was last read; zero before the first check
	policy  string    // maxmemory-policy at the last check
	failed  bool      // the last check could not read maxmemory-policy
	cursor  uint64
}

// maybeCheckLFU re-reads maxmemory-policy every LFUCheckEvery, and at once when a reload turned the keyspace's
// LFU setting on or off: an operator can switch the policy at runtime (CONFIG SET), and OBJECT FREQ answers
// only under an LFU policy.
func (k *loopState) maybeCheckLFU(ctx context.Context, cfg KeyspaceConfig, now time.Time) {
	st := k.lfu
	if cfg.LFU != st.want || (cfg.LFU && (st.checked.IsZero() || now.Sub(st.checked) >= cfg.LFUCheckEvery)) {
		k.checkLFU(ctx)
	}
}

// checkLFU turns the LFU signal on when the keyspace asks for it and Redis's maxmemory-policy is an LFU policy,
// and off otherwise. It logs only changes, so the periodic re-check is silent while nothing changes.
func (k *loopState) checkLFU(ctx context.Context) {
	cfg := k.config()
	now := k.w.now()
	var policy string
	var err error
	if cfg.LFU {
		var res map[string]string
		res, err = k.w.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
		policy = res["maxmemory-policy"]
	}
	enabled := cfg.LFU && err == nil && strings.Contains(policy, "lfu")
	prev := k.lfu
	k.lfu.enabled, k.lfu.want, k.lfu.checked, k.lfu.policy, k.lfu.failed = enabled, cfg.LFU, now, policy, err != nil
	if enabled && !prev.enabled {
		k.lfu.cursor = 0
	}
	if !prev.checked.IsZero() && prev.want == cfg.LFU && prev.enabled == enabled && prev.policy == policy &&
		prev.failed == (err != nil) {
		return
	}
	switch {
	case !cfg.LFU:
		if prev.enabled {
			k.log.Info("lfu signal off: turned off in the config")
		}
	case err != nil:
		k.log.Warn("lfu signal off: cannot read maxmemory-policy", "error", err)
	case !enabled:
		k.log.Info("lfu signal off: Redis maxmemory-policy is not an LFU policy", "maxmemory_policy", policy,
			"check_every", cfg.LFUCheckEvery.String())
	default:
		k.log.Info("lfu signal on", "maxmemory_policy", policy)
	}
}

// scanLFU advances the SCAN of the keyspace's key pattern by one step and returns, for each id found, its
// OBJECT FREQ counter (Redis's logarithmic access counter, 0..255) minus lfuInitVal. Ids at or below
// lfuInitVal are left out: they carry no signal. Keys whose id part is not a valid id are skipped and counted.
func (k *loopState) scanLFU(ctx context.Context, cfg KeyspaceConfig) map[string]uint8 {
	st := k.lfu
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
	k.lfu.cursor = cursor
	if len(keys) == 0 {
		return nil
	}
	var bad []string
	ids := make([]string, 0, len(keys))
	pipe := k.w.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, 0, len(keys))
	for _, key := range keys {
		id, ok := m.id(key)
		if !ok {
			continue
		}
		if cfg.validID(id) != nil {
			bad = append(bad, id)
			continue
		}
		ids = append(ids, id)
		cmds = append(cmds, pipe.ObjectFreq(ctx, key))
	}
	k.skipInvalid(ctx, cfg, sourceLFU, bad)
	if len(cmds) == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx)
	out := make(map[string]uint8, len(ids))
	for i, id := range ids {
		f, err := cmds[i].Result()
		if err != nil || f <= lfuInitVal {
			continue
		}
		out[id] = uint8(min(f-lfuInitVal, 255))
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
