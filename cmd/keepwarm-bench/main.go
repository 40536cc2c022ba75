// Command keepwarm-bench measures keepwarm on the local services: `load` drives the demo keyspaces through the
// lockstep client with Zipf-distributed ids and reports hits, misses and latency per keyspace; `stampede`,
// `trace`, `zipf`, `scale`, `meta` and `peers` are the benchmarks recorded in docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) { // -h: the flag package printed the usage; not a failure
		fmt.Fprintln(os.Stderr, "keepwarm-bench:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

const usage = `usage: keepwarm-bench <command> [flags]

commands:
  load      read the demo keyspaces through the lockstep client with Zipf-distributed ids
  stampede  one hot key, 50 workers: fetch, locked, xfetch, xlocked, lockstep and keepwarm side by side
  trace     replay the OLTP trace (ARC, FAST 2003) through lockstep with the warmer; compare with a static top-K oracle
  zipf      the same as trace on a synthetic Zipf workload (--skew)
  warmup    keepwarm warmup --query over 1,000,000 generated rows vs a naive warmer and the machine's limits
  scale     the warmer itself: memory per tracked key, refresh throughput, Redis commands per refresh, idle CPU
  fleet-scale  a fleet of 3 and 5 warmers keeping 1,000,000 hot keys warm on a Redis Cluster: refreshes/s and CPU
            per replica, Redis commands and CPU per refresh, memory per hot key, keys moved on a join and a leave
  changes   update track rows at a rate; time commit-to-Redis; check cached keys against the origin
  peers     sturdyc, go-redis/cache, redislock, redsync, lockstep (± near cache) and keepwarm side by side: N app
            instances, Zipf reads, shuffled rounds
  meta      Redis memory, CPU and warmup keys/s per cached key, meta hash on and off, vs a plain SET and redis-benchmark
  soak      a fleet of 3 daemons under load, row updates and a randomized nemesis; independent miss and freshness
            observers check the SLO counters, and the end checks orphaned locks, stale values and peak RSS
  plot      redraw a benchmark's SVG from the JSON its --json flag wrote

Run 'keepwarm-bench <command> -h' for a command's flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("no command")}
	}
	switch args[0] {
	case "load":
		return runLoad(ctx, args[1:], stdout, stderr)
	case "warmup":
		return runWarmup(ctx, args[1:], stdout, stderr)
	case "stampede":
		return runStampede(ctx, args[1:], stdout, stderr)
	case "trace":
		return runTrace(ctx, args[1:], stdout, stderr)
	case "zipf":
		return runZipf(ctx, args[1:], stdout, stderr)
	case "fleet-scale":
		return runFleetScale(ctx, args[1:], stdout, stderr)
	case "scale":
		return runScale(ctx, args[1:], stdout, stderr)
	case "changes":
		return runChanges(ctx, args[1:], stdout, stderr)
	case "peers":
		return runPeers(ctx, args[1:], stdout, stderr)
	case "meta":
		return runMeta(ctx, args[1:], stdout, stderr)
	case "soak":
		return runSoak(ctx, args[1:], stdout, stderr)
	case "plot":
		return runPlot(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError{fmt.Errorf("unknown command %q", args[0])}
}

// parse parses flags, turning errors into usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %v", fs.Args())}
	}
	return nil
}
