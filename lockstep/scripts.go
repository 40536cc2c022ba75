package lockstep

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts of the protocol. docs/protocol.md quotes each one verbatim (a test keeps them in sync).
var (
	//go:embed release.lua
	releaseLua string
	//go:embed extend.lua
	extendLua string
	//go:embed publish.lua
	publishLua string
	//go:embed extend_value.lua
	extendValueLua string
	//go:embed extend_value_unlocked.lua
	extendValueUnlockedLua string

	releaseScript     = redis.NewScript(releaseLua)
	extendScript      = redis.NewScript(extendLua)
	publishScript     = redis.NewScript(publishLua)
	extendValueScript = redis.NewScript(extendValueLua)

	extendValueUnlockedScript = redis.NewScript(extendValueUnlockedLua)
)

// PublishLua returns the source of publish.lua, the script Publish and PublishMany run; its header comment gives
// its KEYS, ARGV and reply, and docs/protocol.md quotes it. It is for tools that measure or re-implement the
// protocol's Redis-side work (keepwarm-bench composes its redis-benchmark ceiling from it); an application writes
// with Publish.
func PublishLua() string { return publishLua }

// isNoScript reports whether err is Redis's NOSCRIPT reply: normalised to redis.ErrNoScript on a direct call,
// raw in a pipeline.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// isRedisError reports whether err is an error reply from the server (as opposed to a transport failure, a
// timeout or a cancelled context), which concerns one command only.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// scriptCall is one script invocation in a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// runPipelined runs calls in one pipeline of EVALSHA. When some replies are NOSCRIPT (the server restarted,
// failed over, or someone ran SCRIPT FLUSH), it loads those scripts with SCRIPT LOAD (on every master of a Cluster)
// and retries just those calls in a second pipeline; a call still answered NOSCRIPT after that (a flush racing the
// retry) is sent once more as EVAL. It returns one Cmd per call, in order; the error is a transport failure (the
// per-call Redis errors stay on the Cmds).
func runPipelined(ctx context.Context, c RedisClient, calls []scriptCall) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(calls))
	exec := func(idx []int, eval bool) error {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				call := calls[i]
				if eval {
					cmds[i] = call.script.Eval(ctx, p, call.keys, call.args...)
				} else {
					cmds[i] = call.script.EvalSha(ctx, p, call.keys, call.args...)
				}
			}
			return nil
		})
		return transportError(err, cmds, idx)
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	if err := exec(all, false); err != nil {
		return nil, err
	}
	for attempt := 0; attempt < 2; attempt++ {
		var retry []int
		for i, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				retry = append(retry, i)
			}
		}
		if len(retry) == 0 {
			break
		}
		if attempt == 0 {
			loaded := map[*redis.Script]bool{}
			for _, i := range retry {
				s := calls[i].script
				if loaded[s] {
					continue
				}
				if err := s.Load(ctx, c).Err(); err != nil {
					return nil, fmt.Errorf("script load: %w", err)
				}
				loaded[s] = true
			}
		}
		if err := exec(retry, attempt == 1); err != nil {
			return nil, err
		}
	}
	return cmds, nil
}

// transportError returns the pipeline's error when it is not an error reply of one command (NOSCRIPT, WRONGTYPE,
// redis.Nil...), i.e. when the round trip itself failed.
func transportError(err error, cmds []*redis.Cmd, idx []int) error {
	if err == nil {
		return nil
	}
	for _, i := range idx {
		if e := cmds[i].Err(); e != nil && !isRedisError(e) && !errors.Is(e, redis.Nil) {
			return e
		}
	}
	if isRedisError(err) || errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}
