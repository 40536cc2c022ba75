# keepwarm: `make run` runs the daemon on the Chinook demo; `make test` runs every test against real services.
SHELL := /bin/bash
GO ?= go

# The local services that scripts/services starts (fixed, non-default loopback ports).
export KEEPWARM_REDIS_URL ?= redis://127.0.0.1:16379/0
export KEEPWARM_POSTGRES_URL ?= postgres://keepwarm@127.0.0.1:15432/keepwarm?sslmode=disable

.PHONY: services services-down test vet build

services:
	scripts/services up

services-down:
	scripts/services down

build:
	$(GO) build -o keepwarm ./cmd/keepwarm

vet:
	$(GO) vet ./...

test: services
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

# The Chinook demo (examples/chinook): the catalog in database chinook, plus keepwarm's schema in the same
# database. Idempotent: a second run changes nothing.
KEEPWARM_CHINOOK_DSN ?= postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable

.PHONY: demo-data
demo-data: services
	$(GO) run ./examples/chinook/load -dsn '$(KEEPWARM_CHINOOK_DSN)'
	KEEPWARM_POSTGRES_DSN='$(KEEPWARM_CHINOOK_DSN)' $(GO) run ./cmd/keepwarm migrate up --config config.toml

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
