package deploy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// The container runtime of these tests: Debian's podman with runc. crun fails on this kernel's cgroup set-up, and
// the ulimits keep podman from asking for more than an unprivileged CI container may have.
var podmanRun = []string{"--runtime", "runc", "run", "--network=host",
	"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}

// podman runs podman with args and returns its standard output (the container's, for podman run), with its
// standard error in the error; it fails the test when podman is missing.
func podman(t *testing.T, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Fatal("podman not found: install podman and runc: apt-get install -y podman runc " +
			"(as root, `make test` does it through scripts/test-deps)")
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), err
}

func mustPodman(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := podman(t, ctx, args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func randName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// buildImage builds the shipped Dockerfile's runtime stage on a locally made base (scratch, the host's CA bundle,
// a passwd and group with root and nonroot 65532, like distroless's), with the build stage replaced by a
// directory holding scripts/build-static's binary. It returns the image's name; the images are removed on cleanup.
func buildImage(t *testing.T, ctx context.Context) string {
	t.Helper()
	id := randName()
	base := t.TempDir()
	const ca = "/etc/ssl/certs/ca-certificates.crt"
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		t.Fatalf("the test base image takes the host's CA bundle: %v (apt-get install -y ca-certificates)", err)
	}
	files := map[string]string{
		"etc/ssl/certs/ca-certificates.crt": string(caPEM),
		"etc/passwd":                        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":                         "root:x:0:\nnonroot:x:65532:\n",
		"Containerfile":                     "FROM scratch\nCOPY etc/ /etc/\n",
	}
	for name, body := range files {
		p := filepath.Join(base, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	baseImage := "localhost/keepwarm-testbase:" + id
	image := "localhost/keepwarm-test:" + id
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = podman(t, ctx, "rmi", "-f", image, baseImage)
	})
	mustPodman(t, ctx, "build", "--quiet", "-t", baseImage, base)

	bin := filepath.Join(t.TempDir(), "out", "keepwarm")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	static, err := os.ReadFile(staticBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, static, 0o755); err != nil {
		t.Fatal(err)
	}
	// --format docker keeps HEALTHCHECK (the OCI format has no such field).
	mustPodman(t, ctx, "build", "--quiet", "--format", "docker", "--target", "runtime",
		"--build-arg", "RUNTIME_IMAGE="+baseImage, "--build-context", "build="+filepath.Dir(filepath.Dir(bin)),
		"-t", image, "-f", filepath.Join(mustAbs(t, root), "Dockerfile"), mustAbs(t, root))
	return image
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// imageConfig is the test's config.toml for the container: the local Redis and PostgreSQL, one keyspace under
// prefix whose value is computed by the query alone (no table), one pinned id, and a schedule zoned with CRON_TZ
// that never fires during the test.
func imageConfig(prefix string, port int) string {
	return fmt.Sprintf(`[redis]
url = %q

[postgres]
dsn = %q

[daemon]
listen = "127.0.0.1:%d"
log_format = "json"

[[keyspace]]
name = "pinned"
key = "%sv:${id}"
lock = "%slock:${key}"
ttl = "1m"
query = "select id, json_build_object('id', id) as value from unnest($1::text[]) as id"

[[hotkeys]]
name = "pinned"
keyspace = "pinned"
ids = ["1"]

[[schedule]]
name = "berlin"
cron = "CRON_TZ=Europe/Berlin 0 0 3 * * *"
keyspace = "pinned"
ids = ["1"]
`, testenv.RedisURL(), testenv.PostgresURL(), port, prefix, prefix)
}

// untilDeadline is the time left before ctx's deadline: how long the container may take.
func untilDeadline(ctx context.Context) time.Duration {
	d, _ := ctx.Deadline()
	return time.Until(d)
}

func httpGet(ctx context.Context, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestContainerImage builds the shipped Dockerfile with podman and runs the image as users do: against the local
// Redis and PostgreSQL, until it is ready, serves /metrics and writes a pinned key; `podman stop` then makes it
// exit 0 (no SIGKILL after the grace period) and leave no lock behind. The zoned schedule needs the embedded
// time zone database: the image has no /usr/share/zoneinfo.
func TestContainerImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rdb := testenv.Redis(t)
	testenv.Postgres(t) // fails, saying how to start it, when PostgreSQL is not there
	prefix := testenv.Prefix(t, rdb)
	image := buildImage(t, ctx)

	t.Run("the shipped demo config validates in the image (its schedule is zoned Europe/Paris)", func(t *testing.T) {
		out, err := podman(t, ctx, append(podmanRun, "--rm", "--no-healthcheck", "--entrypoint", "/usr/local/bin/keepwarm", image,
			"validate", "--config", "/etc/keepwarm/config.toml")...)
		if err != nil || !strings.HasPrefix(out, "ok: /etc/keepwarm/config.toml") {
			t.Errorf("keepwarm validate in the image: %v\n%s", err, out)
		}
	})

	port := freePort(t)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(imageConfig(prefix, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	mount := cfgPath + ":/etc/keepwarm/config.toml:ro"

	t.Run("CRON_TZ=Europe/Berlin validates in the image", func(t *testing.T) {
		out, err := podman(t, ctx, append(podmanRun, "--rm", "--no-healthcheck", "-v", mount, "--entrypoint", "/usr/local/bin/keepwarm", image,
			"validate", "--config", "/etc/keepwarm/config.toml")...)
		if err != nil || !strings.HasPrefix(out, "ok: /etc/keepwarm/config.toml: 1 keyspace, 1 hotkeys list, 1 schedule") {
			t.Errorf("keepwarm validate in the image: %v\n%s", err, out)
		}
	})

	name := "keepwarm-test-" + randName()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = podman(t, ctx, "rm", "-f", "-t", "0", name)
	})
	// KEEPWARM_DAEMON_LISTEN as a container would set it: the HEALTHCHECK finds the port there.
	mustPodman(t, ctx, append(podmanRun, "-d", "--name", name, "-v", mount,
		"-e", "KEEPWARM_DAEMON_LISTEN=127.0.0.1:"+strconv.Itoa(port), image)...)
	logs := func() string { // the daemon logs to standard error
		out, err := exec.Command("podman", "logs", name).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("podman logs: %v\n%s", err, out)
		}
		return string(out)
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)

	testenv.EventuallyDiag(t, untilDeadline(ctx), "/readyz answers 200", func() (bool, string) {
		code, body, err := httpGet(ctx, base+"/readyz")
		if err == nil && code == http.StatusOK {
			return true, ""
		}
		if state, _ := podman(t, ctx, "inspect", "-f", "{{.State.Status}}", name); strings.TrimSpace(state) == "exited" {
			t.Fatalf("the container exited before it was ready:\n%s", logs())
		}
		return false, fmt.Sprintf("%d %q %v", code, body, err)
	})

	t.Run("metrics", func(t *testing.T) {
		code, body, err := httpGet(ctx, base+"/metrics")
		if err != nil || code != http.StatusOK || !strings.Contains(body, `keepwarm_build_info{version="`+testVersion+`"} 1`) {
			t.Errorf("/metrics: %d, %v; want 200 with keepwarm_build_info for %s", code, err, testVersion)
		}
	})

	t.Run("the pinned key is written", func(t *testing.T) {
		testenv.EventuallyDiag(t, untilDeadline(ctx), "pinned key "+prefix+"v:1", func() (bool, string) {
			v, err := rdb.Get(ctx, prefix+"v:1").Result()
			return err == nil && v == `{"id" : "1"}`, fmt.Sprintf("%q, %v", v, err)
		})
	})

	t.Run("the zoned schedule's next run is 03:00 in Berlin", func(t *testing.T) {
		code, body, err := httpGet(ctx, base+"/debug/schedules")
		if err != nil || code != http.StatusOK {
			t.Fatalf("/debug/schedules: %d, %v", code, err)
		}
		var sched []struct {
			Name string
			Next time.Time
		}
		if err := json.Unmarshal([]byte(body), &sched); err != nil || len(sched) != 1 {
			t.Fatalf("/debug/schedules: %v: %s", err, body)
		}
		berlin, err := time.LoadLocation("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		if nx := sched[0].Next.In(berlin); nx.Hour() != 3 || nx.Minute() != 0 || sched[0].Next.UTC().Hour() == 3 {
			t.Errorf("next run %v (%v in Berlin), want 03:00 Berlin time, not UTC", sched[0].Next, nx)
		}
	})

	t.Run("HEALTHCHECK", func(t *testing.T) {
		// podman runs the image's HEALTHCHECK command in the container (no systemd timer needed for a manual run).
		if out, err := podman(t, ctx, "--runtime", "runc", "healthcheck", "run", name); err != nil {
			t.Errorf("podman healthcheck run: %v\n%s", err, out)
		}
	})

	// podman stop sends SIGTERM and, after the grace period, SIGKILL (exit code 137).
	mustPodman(t, ctx, "stop", "-t", "30", name)
	out := mustPodman(t, ctx, "inspect", "-f", "{{.State.ExitCode}}", name)
	if code := strings.TrimSpace(out); code != "0" {
		t.Errorf("exit code after podman stop: %s, want 0 (137 is a SIGKILL after the grace period)\n%s", code, logs())
	}
	if l := logs(); !strings.Contains(l, `"msg":"keepwarm stopped"`) {
		t.Errorf("the daemon did not log its clean stop:\n%s", l)
	}
	locks, err := scanKeys(ctx, rdb, prefix+"lock:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 0 {
		t.Errorf("locks left after stop: %q", locks)
	}
}

func scanKeys(ctx context.Context, rdb *redis.Client, match string) ([]string, error) {
	var keys []string
	iter := rdb.Scan(ctx, 0, match, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return keys, nil
}
