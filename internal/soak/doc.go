// Package soak is the randomized fault soak behind `keepwarm-bench soak`: a fleet of keepwarm daemons on the
// Chinook demo, against private Redis and PostgreSQL servers, under load, row updates and a nemesis, with
// outside observers that check the daemons' own SLO counters.
//
// Run does it all and prints the report; Options (DefaultOptions) configures it. The parts, one file each:
//
//   - soak.go: Options, Run, the private servers and the fleet (setup, teardown), the run itself and its
//     background readers of the fleet's hot sets (/debug/hotkeys) and counters (/metrics); the end checks' reads
//     (cached values against PostgreSQL, orphaned locks).
//   - soakenv.go: the environment: a private PostgreSQL (with a synchronous standby when a fault needs one), the
//     toxiproxy in front of a single Redis, daemon processes (start, signal, readiness), counter scraping, peak
//     RSS and the manifest's memory limit. sentinel.go and cluster.go: Redis as a Sentinel group or a Cluster.
//   - observer.go: the miss observer. It polls every hot key's PTTL and records each gap, the time a hot key was
//     absent from Redis, with an ownership rule (the key's owner had it hot) and flush moments.
//   - freshness.go: the freshness observer. It hooks each row update (benchload.UpdateHook) and polls the cached
//     keys the update should change until each holds the new value or the bound ([changes] freshness) passes.
//   - nemesis.go, nemesisfresh.go: the fault kinds (Kinds) and the schedule drawn from the seed (planFaults);
//     each fault heals itself and records whether it bit.
//   - soakreport.go, freshreport.go: the tables (faults, gaps by fault and keyspace, freshness) and the checks:
//     the observer not blind, every gap of at least MinGap counted by the SLO counter (per keyspace) and logged
//     by some daemon for its key (per gap), no phantom counts, no orphaned locks, cached values equal to
//     PostgreSQL, every fault bit, peak RSS under the manifest's limit, no daemon crash, freshness within the
//     bound. A failed check makes Run return a *ChecksError.
//
// The load (Zipf readers through lockstep clients) and the row updater come from internal/benchload, shared with
// the other keepwarm-bench commands. Like them, this package must not import package testing.
package soak
