// Package clustertest runs keepwarm's warmer, its PostgreSQL source and lockstep clients against the Redis
// Cluster (3 masters, 3 replicas) and the Sentinel group (primary, replica, 3 Sentinels) that
// `scripts/services up cluster sentinel` starts and `make test` uses: warmup, refresh and reads across every master,
// a slot migrated key by key while the daemon runs, CLUSTER FAILOVER of a master, and SENTINEL FAILOVER under
// load. It has only tests. They run one at a time (no t.Parallel), because the failovers move the masters that
// the other tests use, and each waits for the topology to be healthy before it starts.
package clustertest
