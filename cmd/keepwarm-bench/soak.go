package main

import (
	"context"
	"flag"
	"io"
	"strings"

	"github.com/keepwarm/keepwarm/internal/soak"
)

// runSoak is `keepwarm-bench soak`: the flags of soak.Options, then soak.Run. Options out of bounds are usage
// errors (exit 2); failed checks exit 1.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := soak.DefaultOptions()
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long the load runs (the setup before and the checks after come on top)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the nemesis's schedule and of the load (replay a failure with the same seed)")
	fs.StringVar(&o.Config, "config", o.Config, "the demo config; its [redis] and [postgres] are replaced by the soak's private servers")
	fs.StringVar(&o.Keepwarm, "keepwarm", o.Keepwarm, "a keepwarm binary to run ('' = go build ./cmd/keepwarm)")
	fs.StringVar(&o.LogDir, "logs", o.LogDir, "where the daemons' logs go ('' = .run/soak/seed-S-TIME)")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "daemons in the fleet")
	fs.IntVar(&o.Workers, "workers", o.Workers, "load workers (Zipf readers through lockstep clients)")
	fs.Float64Var(&o.Zipf, "zipf", o.Zipf, "Zipf exponent of the load's ids")
	fs.Float64Var(&o.UpdateRate, "update-rate", o.UpdateRate, "track row updates per second")
	fs.StringVar(&o.Faults, "faults", o.Faults, "fault kinds the nemesis picks from: all, none (a control run), or a comma-separated list of "+strings.Join(soak.Kinds(), ", ")+
		" (redis-link needs a single Redis, sentinel-failover --sentinel, cluster-migration --cluster)")
	fs.BoolVar(&o.Sentinel, "sentinel", o.Sentinel, "run Redis as a Sentinel group (primary, replica, 3 Sentinels) instead of one server behind a toxiproxy")
	fs.BoolVar(&o.Cluster, "cluster", o.Cluster, "run Redis as a Cluster of 3 masters, with the config's key templates hash-tagged by id")
	fs.DurationVar(&o.Interval, "interval", o.Interval, "the observer's poll interval")
	fs.DurationVar(&o.MinGap, "min-gap", o.MinGap, "observer gaps at least this long must be counted by the SLO counter")
	fs.IntVar(&o.MaxUncounted, "max-uncounted", o.MaxUncounted, "check: uncounted gaps allowed")
	fs.IntVar(&o.MaxUnlogged, "max-unlogged", o.MaxUnlogged, "check: gaps no daemon logged for their key allowed")
	fs.DurationVar(&o.MaxGap, "max-gap", o.MaxGap, "check: the longest a hot key may be missing (0: not checked)")
	fs.Float64Var(&o.PhantomRatio, "phantom-ratio", o.PhantomRatio, "check: the counters' sum may exceed the observer's gaps by this factor ...")
	fs.Float64Var(&o.PhantomSlack, "phantom-slack", o.PhantomSlack, "... plus this many (keys that turn hot and expire within the observer's 1 s hot-set refresh)")
	fs.DurationVar(&o.Settle, "settle", o.Settle, "wait after the last row update before comparing cached values with PostgreSQL")
	fs.IntVar(&o.FreshMaxPending, "fresh-max-pending", o.FreshMaxPending, "the freshness observer judges at most this many keys at once; later changes are not judged (and counted)")
	fs.IntVar(&o.FreshBudget, "fresh-budget", o.FreshBudget, "the freshness observer reads at most this many keys a second (its interval grows with the keys pending)")
	fs.DurationVar(&o.FreshMaxP99, "fresh-max-p99", o.FreshMaxP99, "check: the freshness observer's 99th-percentile poll interval (a slower observer cannot judge a 1 s bound)")
	fs.StringVar(&o.Manifest, "manifest", o.Manifest, "the Kubernetes manifest whose memory limit the daemons' peak RSS is checked against")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return usageError{err}
	}
	return soak.Run(ctx, o, stdout, stderr)
}
