# syntax=docker/dockerfile:1
# keepwarm's image: one static binary on distroless/static (no shell, no libc), running as nonroot.
#
#   docker build --build-arg VERSION="$(git describe --tags --always)" -t keepwarm .
#   docker run --rm keepwarm version
#
# docker-compose.yml runs it with Redis, PostgreSQL (Chinook demo), Prometheus and Grafana. The daemon listens on
# 127.0.0.1:9471 unless KEEPWARM_DAEMON_LISTEN says otherwise; compose sets 0.0.0.0:9471.

# Keep in step with the go directive of go.mod (the deploy tests check it).
ARG GO_VERSION=1.26.8
# The base images are build arguments: point them at a mirror or a pinned digest. The runtime base needs only CA
# certificates and a passwd entry for nonroot (uid 65532); the deploy tests build on a locally made one
# (scratch + /etc/ssl/certs/ca-certificates.crt + /etc/passwd), with --build-context build=DIR in place of the
# build stage (DIR/out/keepwarm made by scripts/build-static), because no registry is reachable there.
ARG BUILD_IMAGE=golang:${GO_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# Modules first: a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# scripts/build-static holds the flags (CGO_ENABLED=0, -trimpath, -ldflags "-s -w -X main.version=...");
# `make build-static` and the deploy tests run the same script.
RUN VERSION="${VERSION}" scripts/build-static /out/keepwarm

FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/keepwarm /usr/local/bin/keepwarm
# The demo config and its hot-key list; mount your own over /etc/keepwarm/config.toml.
COPY config.toml /etc/keepwarm/config.toml
COPY examples/hotkeys /etc/keepwarm/examples/hotkeys
USER nonroot:nonroot
EXPOSE 9471
# distroless has no curl: the binary checks its own /livez, on $KEEPWARM_DAEMON_LISTEN (default 127.0.0.1:9471).
# Liveness, not /readyz: readiness fails while Redis or PostgreSQL is down, which is when the fail-safe works.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/keepwarm", "healthcheck", "--path", "/livez"]
# Exec form: keepwarm is PID 1 and gets SIGTERM itself (it drains in-flight refreshes and releases its locks).
ENTRYPOINT ["/usr/local/bin/keepwarm", "run"]
CMD ["--config", "/etc/keepwarm/config.toml"]
