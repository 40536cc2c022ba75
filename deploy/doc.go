// Package deploy holds no code: it is where keepwarm's deployment files live, and its tests check them against
// the code so that they cannot rot.
//
//   - systemd/keepwarm.service: the unit (Type=notify, watchdog, sandbox); checked directive by directive and
//     with `systemd-analyze verify`.
//   - ../Dockerfile and scripts/build-static: the image's static build; the tests run the same script and inspect
//     the binary (static ELF, CGO_ENABLED=0, -trimpath, the version stamped in).
//   - ../docker-compose.yml, prometheus/prometheus.yml, grafana/provisioning: parsed with compose-spec's own
//     loader (github.com/compose-spec/compose-go/v2) and a YAML parser; no Docker engine is needed.
//   - grafana/keepwarm.json: the dashboard; cmd/keepwarm's TestDashboardMetricsExist checks every metric it
//     queries against the daemon's registry.
//   - nginx/keepwarm.conf: a TLS and basic-auth reverse proxy for the status page (not checked by a test; see
//     docs/operations.md for the run that checked it).
//
// docs/operations.md explains how to use them.
package deploy
