package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/sources/postgres"
)

// FuzzConfig checks the promise of `keepwarm validate` over mutated TOML: a config that config.Load accepts (the
// function validate and run both call) is one every constructor of `run` accepts, and nothing panics on any
// input. The constructors run as in `run` (newParts), with a Redis client and a PostgreSQL pool that are built
// from the config but never connect, plus the HTTP listen address and validate's own summary.
//
// The seed corpus is the checked-in configs (config.toml, deploy/kubernetes/configmap.yaml's config.toml) and
// testdata/fuzz/FuzzConfig (a minimal config and known disagreements between validate and run); `go test` runs it. To search
// (about 500 inputs a second on one core; a count, not a duration: with -fuzztime 30m, go1.26 can end a clean
// run with a bare "context deadline exceeded" and no reproducer, golang/go#75804):
//
//	go test -run '^$' -fuzz FuzzConfig -fuzztime 1000000x -parallel 1 ./cmd/keepwarm/
func FuzzConfig(f *testing.F) {
	demo, err := os.ReadFile(demoConfig)
	if err != nil {
		f.Fatal(err)
	}
	seeds := [][]byte{demo, configMapTOML(f, "../../deploy/kubernetes/configmap.yaml")}
	for _, seed := range seeds {
		f.Add(seed)
	}
	hotkeys, err := os.ReadFile("../../examples/hotkeys/black-friday.txt")
	if err != nil {
		f.Fatal(err)
	}
	// The checked-in configs are valid (a seed that fails to load would only test rejections).
	for _, seed := range seeds {
		if cfg, err := config.LoadEnv(writeFuzzConfig(f, f.TempDir(), seed, hotkeys), nil); err != nil {
			f.Fatalf("seed config does not load: %v", err)
		} else if err := assemblesOffline(cfg); err != nil {
			f.Fatalf("seed config does not build: %v", err)
		}
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		path := writeFuzzConfig(t, t.TempDir(), text, hotkeys)
		cfg, err := config.LoadEnv(path, nil)
		if err != nil {
			var ve *config.ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("Load: %v: want a *config.ValidationError with its problems", err)
			}
			return
		}
		if err := assemblesOffline(cfg); err != nil {
			t.Fatalf("Load accepted the config, but run would not start on it: %v\nconfig:\n%s", err, text)
		}
	})
}

// writeFuzzConfig writes text as dir/config.toml beside the hot-key lists the seed configs name (so that
// mutations of them get past the file check), and returns its path.
func writeFuzzConfig(tb testing.TB, dir string, text, hotkeys []byte) string {
	for _, name := range []string{"examples/hotkeys/black-friday.txt", "hotkeys/front-page.txt"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, hotkeys, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// assemblesOffline runs what `run` and `validate` do with cfg, up to the first I/O: the logger, the listen
// address, the Redis options and client, the pool, newParts, and validate's summary.
func assemblesOffline(cfg *config.Config) error {
	log := newLogger(cfg.Daemon, io.Discard)
	if _, err := net.ResolveTCPAddr("tcp", cfg.Daemon.Listen); err != nil {
		return err
	}
	opts, err := cfg.RedisOptions()
	if err != nil {
		return err
	}
	rdb := redis.NewUniversalClient(opts)
	defer rdb.Close()
	pool, err := postgres.NewPool(context.Background(), cfg.Postgres.DSN, cfg.Postgres.MaxConns, cfg.Postgres.ConnectTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := newParts(cfg, rdb, pool, runs.New(pool, ""), prometheus.NewRegistry(), log); err != nil {
		return err
	}
	summarize(io.Discard, cfg.Path, cfg, false)
	return nil
}

// configMapTOML returns the config.toml block of a Kubernetes ConfigMap manifest: the lines indented under
// "  config.toml: |", unindented.
func configMapTOML(f *testing.F, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	var out bytes.Buffer
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.TrimSpace(line) == "config.toml: |":
			in = true
		case in && line != "" && !strings.HasPrefix(line, "    "):
			in = false
		case in:
			out.WriteString(strings.TrimPrefix(line, "    ") + "\n")
		}
	}
	if out.Len() == 0 {
		f.Fatalf("%s: no config.toml block", path)
	}
	return out.Bytes()
}
