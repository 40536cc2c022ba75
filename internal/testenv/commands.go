package testenv

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Commands is a go-redis hook that counts what a client sends: commands by name (pipelined ones one by one),
// round trips by shape, and error replies by code. Add it with CountCommands. It is safe for concurrent use;
// Reset starts the counts afresh.
//
// A command's name is go-redis's lower-case name, with the subcommand for the container commands that have one
// ("script load", "client kill", "config set"). A round trip is one single command or one pipeline; its shape is
// its upper-case names joined by "+" ("SET+GET"). The handshake go-redis sends on every new connection (HELLO,
// AUTH, SELECT, CLIENT SETINFO...) also passes through hooks; it is per connection, not per request, so it is
// not counted.
type Commands struct {
	name  func(redis.Cmder) string
	mu    sync.Mutex // guards the fields below
	by    map[string]int64
	trips map[string]int64
	errs  map[string]int64
	most  map[string]int64 // by name: the most of it in one round trip
}

// CountCommands adds a Commands hook to c and returns it. It counts each command under CommandName(cmd).
func CountCommands(c redis.UniversalClient) *Commands { return CountCommandsBy(c, CommandName) }

// CountCommandsBy is CountCommands with the caller's names: it counts each command, and names it in round-trip
// shapes, under name(cmd), e.g. to tell one key's SETs from the others'. name is called from the client's
// goroutines, concurrently.
func CountCommandsBy(c redis.UniversalClient, name func(redis.Cmder) string) *Commands {
	h := &Commands{name: name}
	h.Reset()
	c.AddHook(h)
	return h
}

// Count returns how many commands called name (see Commands) were sent since the last Reset.
func (h *Commands) Count(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.by[name]
}

// Counts returns a copy of the counts by name since the last Reset.
func (h *Commands) Counts() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.by)
}

// RoundTrips returns the round trips since the last Reset, by shape ("GET", "SET+GET").
func (h *Commands) RoundTrips() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.trips)
}

// Trips returns the number of round trips since the last Reset.
func (h *Commands) Trips() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, v := range h.trips {
		n += v
	}
	return n
}

// MostInOneTrip returns the largest number of commands called name sent in one round trip since the last Reset.
func (h *Commands) MostInOneTrip(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.most[name]
}

// Errors returns how many replies since the last Reset were server errors with code, the error's first word
// ("NOSCRIPT", "OOM", "WRONGTYPE"). Transport errors and redis.Nil are not replies of this kind.
func (h *Commands) Errors(code string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.errs[code]
}

// Reset sets every count to zero.
func (h *Commands) Reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.by, h.trips, h.errs, h.most = map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string]int64{}
}

// DialHook is go-redis's; Commands does not count connections (see CountingDialer).
func (h *Commands) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a single command when it is sent, and its error reply when it returns.
func (h *Commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		cmds := []redis.Cmder{cmd}
		if isHandshake(cmds) {
			return next(ctx, cmd)
		}
		h.sent(cmds)
		err := next(ctx, cmd) // cmd.Err() is not set yet inside the hook: the reply is err
		h.replied([]error{err})
		return err
	}
}

// ProcessPipelineHook counts a pipeline's commands when it is sent, and their error replies when it returns.
func (h *Commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || isHandshake(cmds) {
			return next(ctx, cmds)
		}
		h.sent(cmds)
		err := next(ctx, cmds)
		errs := make([]error, len(cmds))
		for i, c := range cmds {
			errs[i] = c.Err()
		}
		h.replied(errs)
		return err
	}
}

func (h *Commands) sent(cmds []redis.Cmder) {
	name := h.name
	if name == nil { // a Commands not made by CountCommands(By)
		name = CommandName
	}
	names := make([]string, len(cmds))
	in := map[string]int64{}
	for i, c := range cmds {
		names[i] = name(c)
		in[names[i]]++
	}
	shape := strings.ToUpper(strings.Join(names, "+"))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips[shape]++
	for name, n := range in {
		h.by[name] += n
		h.most[name] = max(h.most[name], n)
	}
}

func (h *Commands) replied(errs []error) {
	var codes []string
	for _, err := range errs {
		var re redis.Error
		if err == nil || errors.Is(err, redis.Nil) || !errors.As(err, &re) {
			continue
		}
		code, _, _ := strings.Cut(re.Error(), " ")
		codes = append(codes, code)
	}
	if len(codes) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, code := range codes {
		h.errs[code]++
	}
}

// containers are the commands whose name alone does not say what they do; Commands counts them with their
// subcommand.
var containers = map[string]bool{"script": true, "client": true, "config": true, "cluster": true, "command": true,
	"function": true, "object": true, "memory": true, "xinfo": true, "acl": true, "latency": true, "slowlog": true,
	"pubsub": true, "module": true}

// CommandName is the name Commands counts cmd under: go-redis's lower-case name, followed for a container command
// by its lower-case subcommand ("script load").
func CommandName(cmd redis.Cmder) string {
	name := cmd.Name()
	if args := cmd.Args(); containers[name] && len(args) > 1 {
		if sub, ok := args[1].(string); ok {
			return name + " " + strings.ToLower(sub)
		}
	}
	return name
}

// isHandshake reports whether cmds are a new connection's handshake (HELLO, AUTH, SELECT, CLIENT SETNAME and
// SETINFO, READONLY), which go-redis sends through the hooks too.
func isHandshake(cmds []redis.Cmder) bool {
	switch cmds[0].Name() {
	case "hello", "auth", "select", "readonly":
		return true
	case "client":
		n := CommandName(cmds[0])
		return n == "client setname" || n == "client setinfo"
	}
	return false
}
