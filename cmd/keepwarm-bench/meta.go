package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/benchload"
	"github.com/keepwarm/keepwarm/internal/redisserver"
	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/warmer"
)

// The meta scenario measures, side by side in one run on a private redis-server, what a cached key
// costs Redis when keepwarm writes it with and without the meta hash, against a plain pipelined SET of the same
// values with the same TTL: memory per key (INFO memory), Redis CPU per key (INFO commandstats and INFO cpu), and
// warmup keys/s; and, as the ceiling of a locked write, redis-benchmark running the same Redis-side work as one
// script per key (take the lock, then the publish steps on that key; __rand_int__ keys, -P 64).

type metaConfig struct {
	keys       int
	valueBytes int
	ttl        time.Duration
	port       int
	batch      int
	conc       int
	jsonPath   string
	pin        bool
}

func runMeta(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c metaConfig
	fs := flag.NewFlagSet("meta", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.keys, "keys", 200000, "keys written by each side")
	fs.IntVar(&c.valueBytes, "value-bytes", 314, "bytes per value (the issue's measurement used 314)")
	fs.DurationVar(&c.ttl, "ttl", time.Hour, "TTL of every written key (long: nothing expires during the run)")
	fs.IntVar(&c.port, "port", 29000, "port of the private redis-server (0: a free one)")
	fs.IntVar(&c.batch, "batch-size", 1000, "the warmup keyspace's batch_size")
	fs.IntVar(&c.conc, "concurrency", 4, "the warmup keyspace's max_origin_concurrency")
	fs.StringVar(&c.jsonPath, "json", "", "write the results as JSON to this file")
	fs.BoolVar(&c.pin, "pin", false, "pin the private redis-server to CPU 0 and the client side (this process's threads, redis-benchmark) to CPU 1 with taskset, so that neither competes with Redis for its core")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.pin && runtime.NumCPU() < 2 {
		return usageError{fmt.Errorf("--pin needs 2 CPUs, this machine has %d", runtime.NumCPU())}
	}
	if c.keys < 1 || c.valueBytes < 1 {
		return usageError{fmt.Errorf("--keys and --value-bytes must be positive")}
	}
	rep, err := metaBench(ctx, c, stdout, stderr)
	if err != nil {
		return err
	}
	return writeResults("", c.jsonPath, rep, func(*metaReport) []byte { return nil }, stderr)
}

type metaSide struct {
	Name          string           `json:"name"`
	Keys          int              `json:"keys"`
	Seconds       float64          `json:"seconds"`
	KeysPerSec    float64          `json:"keys_per_s"`
	MemPerKey     float64          `json:"used_memory_bytes_per_key"`
	CmdUsecPerKey float64          `json:"commandstats_usec_per_key"`
	CPUUsecPerKey float64          `json:"server_cpu_usec_per_key"`
	CallsPerKey   float64          `json:"calls_per_key"`
	Calls         map[string]int64 `json:"calls"`
}

type metaReport struct {
	Machine machine    `json:"machine"`
	Sides   []metaSide `json:"sides"`
	Ceiling []metaSide `json:"redis_benchmark"`
	// Pinned: the redis-server ran on CPU 0, the warmer's process and redis-benchmark on CPU 1 (--pin).
	Pinned bool `json:"pinned"`
}

// ceilingScripts do, per key, what a keepwarm warmup makes Redis do: take the lock, then lockstep's publish
// script on the same key, with the meta hash off or on (see ceilingScript).
var ceilingScripts = map[string]string{"meta off": ceilingScript(false), "meta on": ceilingScript(true)}

// ceilingScript takes the lock of KEYS[1] and publishes ARGV[2] with TTL ARGV[3] ms under token ARGV[1], by running
// lockstep.PublishLua itself as a Lua function whose KEYS and ARGV are built here: the lock and meta keys are
// derived from the one __rand_int__ key, because redis-benchmark draws a separate number for each placeholder.
// δ is 3 ms and there is no stale copy.
func ceilingScript(meta bool) string {
	mode := "nometa"
	if meta {
		mode = "meta"
	}
	return "local function publish(KEYS, ARGV)\n" + lockstep.PublishLua() + "\nend\n" +
		`local lock = "lock:" .. KEYS[1]
redis.call("SET", lock, ARGV[1], "NX", "PX", 10000)
return publish({KEYS[1], lock, "meta:" .. KEYS[1]}, {ARGV[1], "set", ARGV[2], ARGV[3], "3", "0", "` + mode + `"})
`
}

func metaBench(ctx context.Context, c metaConfig, stdout, stderr io.Writer) (*metaReport, error) {
	srv, err := redisserver.StartPort(ctx, c.port)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	fmt.Fprintf(stderr, "meta: private redis-server at %s\n", srv.URL)
	if c.pin {
		// taskset -a sets every thread's mask; threads created later inherit their creator's, so the whole Go
		// process stays on CPU 1 from here on.
		if err := pinPID(ctx, srv.Process.Pid, serverCPU); err != nil {
			return nil, err
		}
		if err := pinPID(ctx, os.Getpid(), clientCPU); err != nil {
			return nil, err
		}
	}
	rdb, err := benchload.NewRedis(ctx, srv.URL, 8)
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	rep := &metaReport{Machine: describeMachine(ctx, rdb, nil), Pinned: c.pin}
	fmt.Fprintln(stdout, rep.Machine, "(PostgreSQL not used: the Source is in memory)")
	if c.pin {
		fmt.Fprintf(stdout, "pinned: redis-server on CPU %s; keepwarm-bench's threads (GOMAXPROCS %d) and redis-benchmark on CPU %s\n",
			serverCPU, runtime.GOMAXPROCS(0), clientCPU)
	}

	ids := make([]string, c.keys)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	src := &fixedSource{size: c.valueBytes}
	keys, err := lockstep.NewKeys("mb:${id}", "", "", "")
	if err != nil {
		return nil, err
	}
	sides := []struct {
		name  string
		write func(ctx context.Context) error
	}{
		{"plain SET PX, pipelined", func(ctx context.Context) error { return plainSets(ctx, rdb, ids, src, c) }},
		{"keepwarm warmup, meta off", func(ctx context.Context) error { return metaWarmup(ctx, srv.URL, keys, ids, src, c, false) }},
		{"keepwarm warmup, meta on", func(ctx context.Context) error { return metaWarmup(ctx, srv.URL, keys, ids, src, c, true) }},
	}
	// Every side writes the same ids; check that each stored all of them.
	check := func(name string) error {
		if got := rdb.Eval(ctx, `return #redis.call("KEYS", "mb:*")`, nil).Val(); got != int64(c.keys) {
			return fmt.Errorf("%s: %v cached keys stored, want %d", name, got, c.keys)
		}
		return nil
	}
	for _, s := range sides {
		fmt.Fprintf(stderr, "meta: %s, %d keys\n", s.name, c.keys)
		side, err := measureSide(ctx, rdb, s.name, c.keys, s.write)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		if err := check(s.name); err != nil {
			return nil, err
		}
		rep.Sides = append(rep.Sides, *side)
	}
	for _, name := range []string{"meta off", "meta on"} {
		fmt.Fprintf(stderr, "meta: redis-benchmark, lock + publish steps (%s) per key\n", name)
		side, err := measureSide(ctx, rdb, "redis-benchmark: lock + publish ("+name+")", 3*c.keys, func(ctx context.Context) error {
			return ceilingRun(ctx, rdb, srv.URL, ceilingScripts[name], c)
		})
		if err != nil {
			return nil, fmt.Errorf("redis-benchmark (%s): %w", name, err)
		}
		rep.Ceiling = append(rep.Ceiling, *side)
	}
	printMeta(stdout, c, rep)
	return rep, nil
}

// fixedSource serves, for every id, the same size of JSON-like bytes (the id and padding).
type fixedSource struct{ size int }

func (s *fixedSource) value(id string) []byte {
	v := []byte(`{"id":"` + id + `","body":"`)
	for len(v) < s.size-2 {
		v = append(v, 'x')
	}
	return append(v, '"', '}')[:max(s.size, 0)]
}

func (s *fixedSource) Fetch(_ context.Context, ids []string) (map[string][]byte, []string, error) {
	out := make(map[string][]byte, len(ids))
	for _, id := range ids {
		out[id] = s.value(id)
	}
	return out, nil, nil
}

// measureSide empties the private server, resets its counters, runs write (n writes), and reads what it cost:
// memory per key stored (DBSIZE afterwards), CPU, calls and rate per write.
func measureSide(ctx context.Context, rdb *redis.Client, name string, n int, write func(context.Context) error) (*metaSide, error) {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return nil, err
	}
	mem0, cpu0, err := memAndCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	s0, err := commandUsec(ctx, rdb)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := write(ctx); err != nil {
		return nil, err
	}
	took := time.Since(start)
	s1, err := commandUsec(ctx, rdb)
	if err != nil {
		return nil, err
	}
	mem1, cpu1, err := memAndCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	// Cached values only (the mb: keys), not their meta hashes: the cost of a meta hash is part of its value's.
	stored, err := rdb.Eval(ctx, `return #redis.call("KEYS", "mb:*")`, nil).Int64()
	if err != nil || stored < 1 {
		return nil, fmt.Errorf("%d cached keys in Redis after %d writes (%v)", stored, n, err)
	}
	calls := map[string]int64{}
	var usec, ncalls int64
	for k, v := range s1 {
		if k == "info" || k == "config|resetstat" || k == "dbsize" || k == "eval" || k == "keys" {
			continue
		}
		d := v
		d.calls -= s0[k].calls
		d.usec -= s0[k].usec
		if d.calls > 0 {
			calls[k] = d.calls
			ncalls += d.calls
			usec += d.usec
		}
	}
	return &metaSide{Name: name, Keys: n, Seconds: took.Seconds(), KeysPerSec: float64(n) / took.Seconds(),
		MemPerKey: float64(mem1-mem0) / float64(stored), CmdUsecPerKey: float64(usec) / float64(n),
		CPUUsecPerKey: (cpu1 - cpu0) * 1e6 / float64(n), CallsPerKey: float64(ncalls) / float64(n), Calls: calls}, nil
}

type cmdStat struct{ calls, usec int64 }

// commandUsec reads INFO commandstats: calls and usec per command (scripts' inner calls included).
func commandUsec(ctx context.Context, rdb *redis.Client) (map[string]cmdStat, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	re := regexp.MustCompile(`^cmdstat_([^:]+):calls=(\d+),usec=(\d+),`)
	for _, line := range strings.Split(info, "\n") {
		if m := re.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			calls, _ := strconv.ParseInt(m[2], 10, 64)
			usec, _ := strconv.ParseInt(m[3], 10, 64)
			out[m[1]] = cmdStat{calls, usec}
		}
	}
	return out, nil
}

// memAndCPU reads used_memory (bytes) and the server's used_cpu_sys + used_cpu_user (seconds).
func memAndCPU(ctx context.Context, rdb *redis.Client) (mem int64, cpu float64, err error) {
	info, err := rdb.Info(ctx, "memory", "cpu").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			mem, _ = strconv.ParseInt(v, 10, 64)
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		}
	}
	return mem, cpu, nil
}

// plainSets writes every id's value with SET PX, pipelined in batches, c.conc pipelines at a time.
func plainSets(ctx context.Context, rdb *redis.Client, ids []string, src *fixedSource, c metaConfig) error {
	batches := make(chan []string)
	var wg sync.WaitGroup
	errs := make(chan error, c.conc)
	for range c.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, id := range b {
						p.Set(ctx, "mb:"+id, src.value(id), c.ttl)
					}
					return nil
				})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < len(ids); i += c.batch {
		batches <- ids[i:min(i+c.batch, len(ids))]
	}
	close(batches)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// metaWarmup runs the warmer's own warmup (lock, publish script, pipelined per batch) over ids.
func metaWarmup(ctx context.Context, url string, keys *lockstep.Keys, ids []string, src *fixedSource, c metaConfig, keepMeta bool) error {
	rdb, err := benchload.NewRedis(ctx, url, 8)
	if err != nil {
		return err
	}
	defer rdb.Close()
	ks := warmer.KeyspaceConfig{Name: "meta", Keys: keys, Src: src, TTL: c.ttl, BatchSize: c.batch,
		MaxOriginConcurrency: c.conc, KeepMeta: keepMeta}
	w, err := warmer.New(rdb, warmer.Config{Logger: slog.New(slog.DiscardHandler), Keyspaces: []warmer.KeyspaceConfig{ks}})
	if err != nil {
		return err
	}
	res, err := w.Warmup(ctx, "meta", warmer.SliceIDs(ids), warmer.WarmupOptions{})
	if err != nil {
		return err
	}
	if res.Written != int64(len(ids)) {
		return fmt.Errorf("warmup wrote %d of %d keys (first error: %v)", res.Written, len(ids), res.FirstError)
	}
	return nil
}

// ceilingRun loads script and runs it once per key with redis-benchmark: -P 64, __rand_int__ keys over c.keys.
func ceilingRun(ctx context.Context, rdb *redis.Client, url, script string, c metaConfig) error {
	sha, err := rdb.ScriptLoad(ctx, script).Result()
	if err != nil {
		return err
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	host, port, _ := strings.Cut(opt.Addr, ":")
	value := string((&fixedSource{size: c.valueBytes}).value("__rand_int__"))
	// -n 3×keys over -r keys keys: nearly every key is written at least once (1 − e^-3 = 95%); rewrites cost the
	// same Redis-side work, so the rate is per script call.
	n := 3 * c.keys
	argv := []string{"redis-benchmark", "-h", host, "-p", port, "-P", "64", "-n", strconv.Itoa(n),
		"-r", strconv.Itoa(c.keys), "-q", "EVALSHA", sha, "1", "mb:__rand_int__", "token", value,
		strconv.FormatInt(c.ttl.Milliseconds(), 10)}
	if c.pin {
		argv = append([]string{"taskset", "-c", clientCPU}, argv...)
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-benchmark (apt-get install redis-tools): %w\n%s", err, out)
	}
	if !regexp.MustCompile(`[\d.]+ requests per second`).Match(out) {
		return fmt.Errorf("redis-benchmark: no rate in %q", out)
	}
	return nil
}

func printMeta(w io.Writer, c metaConfig, rep *metaReport) {
	fmt.Fprintf(w, "\n%d keys of %d bytes, TTL %v, one run on a private redis-server. B/key: INFO used_memory growth per cached value\n"+
		"(its meta hash included); CPU: the server process's used_cpu_user+sys (INFO cpu) per write; calls: INFO commandstats\n"+
		"per write, scripts' inner calls included; per key written, and per script call for redis-benchmark.\n\n",
		c.keys, c.valueBytes, c.ttl)
	fmt.Fprintf(w, "  %-44s %8s %7s %12s %10s %10s\n", "side", "B/key", "vs SET", "CPU µs/key", "calls/key", "keys/s")
	base := rep.Sides[0].MemPerKey
	for _, s := range append(append([]metaSide{}, rep.Sides...), rep.Ceiling...) {
		fmt.Fprintf(w, "  %-44s %8.1f %6.2fx %12.2f %10.2f %10.0f\n", s.Name, s.MemPerKey, s.MemPerKey/base,
			s.CPUUsecPerKey, s.CallsPerKey, s.KeysPerSec)
	}
	fmt.Fprintln(w)
	for i, name := range []string{"meta off", "meta on"} {
		if len(rep.Sides) > i+1 && len(rep.Ceiling) > i {
			fmt.Fprintf(w, "  warmup throughput, %s: %.0f keys/s ÷ redis-benchmark's %.0f script calls/s = %.2f (target >= 0.50)%s\n",
				name, rep.Sides[i+1].KeysPerSec, rep.Ceiling[i].KeysPerSec, rep.Sides[i+1].KeysPerSec/rep.Ceiling[i].KeysPerSec, pinNote(rep.Pinned))
		}
	}
	fmt.Fprintf(w, "  memory per cached key, meta off: %.2fx a plain SET (target <= 1.10x); meta on: %.2fx\n",
		rep.Sides[1].MemPerKey/base, rep.Sides[2].MemPerKey/base)
	fmt.Fprintf(w, "  Redis CPU per warmed key, meta off: %.2fx a plain SET; meta on: %.2fx\n",
		rep.Sides[1].CPUUsecPerKey/rep.Sides[0].CPUUsecPerKey, rep.Sides[2].CPUUsecPerKey/rep.Sides[0].CPUUsecPerKey)
}

// The CPUs of --pin: Redis alone on one, the client side (the warmer or redis-benchmark, never both at once) on
// the other.
const (
	serverCPU = "0"
	clientCPU = "1"
)

// pinPID sets the CPU affinity of every thread of process pid to cpus (taskset -a -p -c), then checks what
// /proc says the process may use now (taskset -a succeeds for a pid with no threads); it returns why not.
func pinPID(ctx context.Context, pid int, cpus string) error {
	out, err := exec.CommandContext(ctx, "taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pin process %d to CPU %s (taskset, from util-linux): %w\n%s", pid, cpus, err, out)
	}
	got, err := allowedCPUs(pid)
	if err != nil {
		return fmt.Errorf("pin process %d to CPU %s: %w", pid, cpus, err)
	}
	if got != cpus {
		return fmt.Errorf("pin process %d to CPU %s: it may still run on CPUs %s", pid, cpus, got)
	}
	return nil
}

// allowedCPUs returns the Cpus_allowed_list of process pid's main thread, e.g. "0" or "0-1".
func allowedCPUs(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no Cpus_allowed_list in /proc/%d/status", pid)
}

func pinNote(pinned bool) string {
	if pinned {
		return "; Redis on CPU " + serverCPU + ", the client side on CPU " + clientCPU
	}
	return "; not pinned: the client side and Redis share the cores"
}
