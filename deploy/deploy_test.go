package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// root is the repository root, relative to this package.
const root = ".."

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// loadCompose parses docker-compose.yml as `docker compose config` would, with env as the only environment.
func loadCompose(t *testing.T, env ...string) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(abs, "docker-compose.yml")},
		cli.WithWorkingDirectory(abs), cli.WithName("keepwarm"), cli.WithEnv(env), cli.WithResolvedPaths(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range p.Services {
			if !yield(n) {
				return
			}
		}
	})
	if want := []string{"grafana", "keepwarm", "migrate", "postgres", "prometheus", "redis"}; !slices.Equal(names, want) {
		t.Fatalf("services = %v, want %v", names, want)
	}
	kw := p.Services["keepwarm"]

	t.Run("ports on the host's loopback only", func(t *testing.T) {
		want := map[string]string{"keepwarm": "9471", "prometheus": "9090", "grafana": "3000"}
		for name, s := range p.Services {
			for _, port := range s.Ports {
				if port.HostIP != "127.0.0.1" {
					t.Errorf("%s publishes %s:%s on %q, want 127.0.0.1", name, port.Published, strconvU(port.Target), port.HostIP)
				}
			}
			if w, ok := want[name]; ok {
				if len(s.Ports) != 1 || s.Ports[0].Published != w || strconvU(s.Ports[0].Target) != w {
					t.Errorf("%s ports = %+v, want 127.0.0.1:%s:%s", name, s.Ports, w, w)
				}
			} else if len(s.Ports) != 0 {
				t.Errorf("%s publishes ports %+v; only %v should", name, s.Ports, want)
			}
		}
	})

	t.Run("keepwarm: config mounted, services by name, listening beyond loopback", func(t *testing.T) {
		if kw.Build == nil || kw.Build.Context != mustAbs(t, root) {
			t.Errorf("keepwarm builds from %+v, want the repository root", kw.Build)
		}
		for _, svc := range []string{"keepwarm", "migrate"} {
			if !hasBind(p.Services[svc], "config.toml", "/etc/keepwarm/config.toml") {
				t.Errorf("%s does not mount ./config.toml read-only at /etc/keepwarm/config.toml: %+v", svc, p.Services[svc].Volumes)
			}
			if !hasBind(p.Services[svc], "examples/hotkeys", "/etc/keepwarm/examples/hotkeys") {
				t.Errorf("%s does not mount the hot-key files that config.toml names", svc)
			}
		}
		wantEnv := map[string]string{
			"KEEPWARM_REDIS_URL":     "redis://redis:6379/0",
			"KEEPWARM_POSTGRES_DSN":  "postgres://keepwarm:keepwarm@postgres:5432/chinook?sslmode=disable",
			"KEEPWARM_DAEMON_LISTEN": "0.0.0.0:9471",
		}
		for k, want := range wantEnv {
			if got := kw.Environment[k]; got == nil || *got != want {
				t.Errorf("keepwarm env %s = %v, want %q", k, deref(got), want)
			}
		}
		if got := strings.Join(kw.Command, " "); got != "--config /etc/keepwarm/config.toml" {
			t.Errorf("keepwarm command = %q", got)
		}
		if kw.StopGracePeriod == nil || *kw.StopGracePeriod < types.Duration(15e9) {
			t.Errorf("stop_grace_period %v: want at least 15 s, more than the daemon's 10 s drain", kw.StopGracePeriod)
		}
	})

	t.Run("health checks", func(t *testing.T) {
		want := map[string]string{
			"keepwarm": "CMD /usr/local/bin/keepwarm healthcheck --path /livez",
			"redis":    "CMD redis-cli ping",
			"postgres": "CMD pg_isready -h 127.0.0.1 -U keepwarm -d chinook",
		}
		for name, w := range want {
			hc := p.Services[name].HealthCheck
			if hc == nil || strings.Join(hc.Test, " ") != w {
				t.Errorf("%s healthcheck = %+v, want %q", name, hc, w)
			}
		}
	})

	t.Run("start order", func(t *testing.T) {
		deps := map[string]map[string]string{
			"migrate":  {"postgres": types.ServiceConditionHealthy},
			"keepwarm": {"redis": types.ServiceConditionHealthy, "postgres": types.ServiceConditionHealthy, "migrate": types.ServiceConditionCompletedSuccessfully},
		}
		for svc, want := range deps {
			for dep, cond := range want {
				if got := p.Services[svc].DependsOn[dep].Condition; got != cond {
					t.Errorf("%s depends on %s with condition %q, want %q", svc, dep, got, cond)
				}
			}
		}
		if got := strings.Join(p.Services["migrate"].Entrypoint, " "); got != "/usr/local/bin/keepwarm migrate up" {
			t.Errorf("migrate entrypoint = %q", got)
		}
	})

	t.Run("postgres loads Chinook on first start", func(t *testing.T) {
		pg := p.Services["postgres"]
		if !hasBind(pg, "examples/chinook/Chinook_PostgreSql.sql", "/docker-entrypoint-initdb.d/10-chinook.sql") {
			t.Errorf("postgres does not mount the Chinook script into /docker-entrypoint-initdb.d: %+v", pg.Volumes)
		}
		// The script drops and creates database chinook, so psql must start in another one.
		if db := deref(pg.Environment["POSTGRES_DB"]); db == "chinook" || db == "" {
			t.Errorf("POSTGRES_DB = %q: the Chinook script runs DROP DATABASE chinook from it", db)
		}
	})

	t.Run("prometheus and grafana files", func(t *testing.T) {
		if !hasBind(p.Services["prometheus"], "deploy/prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml") {
			t.Errorf("prometheus does not mount deploy/prometheus/prometheus.yml")
		}
		g := p.Services["grafana"]
		if !hasBind(g, "deploy/grafana/provisioning", "/etc/grafana/provisioning") ||
			!hasBind(g, "deploy/grafana/keepwarm.json", "/var/lib/grafana/dashboards/keepwarm.json") {
			t.Errorf("grafana does not mount its provisioning and the dashboard: %+v", g.Volumes)
		}
	})

	t.Run("every bind-mounted file exists", func(t *testing.T) {
		for name, s := range p.Services {
			for _, v := range s.Volumes {
				if v.Type != types.VolumeTypeBind {
					continue
				}
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("%s mounts %s: %v", name, v.Source, err)
				}
			}
		}
	})
}

func TestComposePasswordFromEnvironment(t *testing.T) {
	p := loadCompose(t, "POSTGRES_PASSWORD=s3cret")
	for _, svc := range []string{"keepwarm", "migrate"} {
		if got := deref(p.Services[svc].Environment["KEEPWARM_POSTGRES_DSN"]); !strings.Contains(got, "keepwarm:s3cret@postgres:5432") {
			t.Errorf("%s DSN = %q, want the password from $POSTGRES_PASSWORD", svc, got)
		}
	}
	if got := deref(p.Services["postgres"].Environment["POSTGRES_PASSWORD"]); got != "s3cret" {
		t.Errorf("postgres POSTGRES_PASSWORD = %q", got)
	}
}

func TestPrometheusScrapesKeepwarm(t *testing.T) {
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(read(t, "deploy/prometheus/prometheus.yml"), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ScrapeConfigs) != 1 {
		t.Fatalf("scrape_configs: %+v, want one job", cfg.ScrapeConfigs)
	}
	sc := cfg.ScrapeConfigs[0]
	// The target must be the compose service on the port of its KEEPWARM_DAEMON_LISTEN.
	listen := deref(loadCompose(t).Services["keepwarm"].Environment["KEEPWARM_DAEMON_LISTEN"])
	_, port, _ := strings.Cut(listen, ":")
	if sc.JobName != "keepwarm" || sc.MetricsPath != "/metrics" || len(sc.StaticConfigs) != 1 ||
		!slices.Equal(sc.StaticConfigs[0].Targets, []string{"keepwarm:" + port}) {
		t.Errorf("scrape config %+v, want job keepwarm scraping keepwarm:%s/metrics", sc, port)
	}
}

func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(read(t, "deploy/grafana/provisioning/datasources/prometheus.yml"), &ds); err != nil {
		t.Fatal(err)
	}
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Fatalf("datasources: %+v", ds.Datasources)
	}
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name    string `json:"name"`
				Current struct {
					Value string `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(read(t, "deploy/grafana/keepwarm.json"), &dash); err != nil {
		t.Fatalf("keepwarm.json: %v", err)
	}
	for _, v := range dash.Templating.List {
		if v.Name == "datasource" && v.Current.Value != ds.Datasources[0].UID {
			t.Errorf("the dashboard's default data source %q is not the provisioned one (%q)", v.Current.Value, ds.Datasources[0].UID)
		}
	}
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal(read(t, "deploy/grafana/provisioning/dashboards/keepwarm.yml"), &prov); err != nil {
		t.Fatal(err)
	}
	if len(prov.Providers) != 1 || prov.Providers[0].Options.Path != "/var/lib/grafana/dashboards" {
		t.Errorf("dashboard provider: %+v, want one reading /var/lib/grafana/dashboards, where compose mounts keepwarm.json", prov.Providers)
	}
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	var out []instruction
	sc := bufio.NewScanner(bytes.NewReader(read(t, "Dockerfile")))
	var cur string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		cur += line
		cmd, args, _ := strings.Cut(cur, " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur = ""
	}
	return out
}

func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	get := func(cmd string) []string {
		var out []string
		for _, i := range ins {
			if i.cmd == cmd {
				out = append(out, i.args)
			}
		}
		return out
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(read(t, "go.mod"))
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}
	if args := get("ARG"); !slices.Contains(args, "GO_VERSION="+string(goVersion[1])) {
		t.Errorf("Dockerfile ARGs %q: want GO_VERSION=%s, go.mod's go directive", args, goVersion[1])
	}
	from := get("FROM")
	if len(from) != 2 || from[0] != "${BUILD_IMAGE} AS build" || from[1] != "${RUNTIME_IMAGE} AS runtime" {
		t.Errorf("FROM %q: want the base images as build arguments, stages build and runtime", from)
	}
	for _, want := range []string{"BUILD_IMAGE=golang:${GO_VERSION}-bookworm", "RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot"} {
		if !slices.Contains(get("ARG"), want) {
			t.Errorf("Dockerfile ARGs %q: want %s, the default base", get("ARG"), want)
		}
	}
	if !slices.Contains(get("RUN"), `VERSION="${VERSION}" scripts/build-static /out/keepwarm`) {
		t.Errorf("RUN %q: the build must be scripts/build-static, the flags' one source", get("RUN"))
	}
	if !slices.Contains(get("COPY"), "--from=build /out/keepwarm /usr/local/bin/keepwarm") {
		t.Errorf("COPY %q: want the static binary from the build stage", get("COPY"))
	}
	if u := get("USER"); len(u) != 1 || u[0] != "nonroot:nonroot" {
		t.Errorf("USER %q, want nonroot:nonroot", u)
	}
	// Exec form (a JSON array): keepwarm is PID 1 and receives SIGTERM itself.
	for cmd, want := range map[string][]string{
		"ENTRYPOINT": {"/usr/local/bin/keepwarm", "run"},
		"CMD":        {"--config", "/etc/keepwarm/config.toml"},
	} {
		args := get(cmd)
		var got []string
		if len(args) != 1 || json.Unmarshal([]byte(args[0]), &got) != nil || !slices.Equal(got, want) {
			t.Errorf("%s %q, want the exec form %q", cmd, args, want)
		}
	}
	// Liveness: /readyz fails while a dependency is down, and an unhealthy container gets restarted.
	if hc := get("HEALTHCHECK"); len(hc) != 1 || !strings.HasSuffix(hc[0], `CMD ["/usr/local/bin/keepwarm", "healthcheck", "--path", "/livez"]`) {
		t.Errorf("HEALTHCHECK %q: want keepwarm healthcheck on /livez", hc)
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildOut  []byte
	buildErr  error
)

// testVersion is stamped into the test build.
const testVersion = "v0.0.0-deploytest"

// staticBinary builds keepwarm with scripts/build-static, exactly as the Dockerfile does, once per test run.
func staticBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "keepwarm-static-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "keepwarm")
		cmd := exec.Command(filepath.Join(root, "scripts", "build-static"), binPath)
		cmd.Env = append(os.Environ(), "VERSION="+testVersion)
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("scripts/build-static: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

func TestStaticBuild(t *testing.T) {
	bin := staticBinary(t)
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	// -trimpath keeps -ldflags out of the build info; -s -w and -X are checked on the binary below.
	for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
		if got := settings[k]; got != want {
			t.Errorf("build setting %s = %q, want %q", k, got, want)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	for _, name := range []string{".symtab", ".debug_info"} { // -s, -w
		if f.Section(name) != nil {
			t.Errorf("the binary has a %s section: not built with -ldflags \"-s -w\"", name)
		}
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "keepwarm "+testVersion+" (go") {
		t.Errorf("keepwarm version: %q, %v; want it to report %s", out, err, testVersion)
	}
}

// unit is a systemd unit file: section → key → values (a key may repeat).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, b []byte) unit {
	t.Helper()
	u := unit{}
	section := ""
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("keepwarm.service line %d: %q is not key=value in a section", n+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func TestSystemdUnit(t *testing.T) {
	raw := read(t, "deploy/systemd/keepwarm.service")
	u := parseUnit(t, raw)
	svc := u["Service"]
	one := func(k string) string {
		if v := svc[k]; len(v) == 1 {
			return v[0]
		}
		return strings.Join(svc[k], " | ")
	}
	for k, want := range map[string]string{
		"Type":            "notify",
		"NotifyAccess":    "main",
		"ExecStart":       "/usr/local/bin/keepwarm run --config /etc/keepwarm/config.toml",
		"ExecReload":      "/bin/sh -c 'kill -HUP ${MAINPID}'",
		"EnvironmentFile": "/etc/keepwarm/keepwarm.env",
		"WatchdogSec":     "30s",
		"Restart":         "on-failure",
		"DynamicUser":     "yes",
		"ProtectSystem":   "strict",
		"NoNewPrivileges": "yes",
		"PrivateTmp":      "yes",
		"ProtectHome":     "yes",
	} {
		if got := one(k); got != want {
			t.Errorf("[Service] %s = %q, want %q", k, got, want)
		}
	}
	if got := u["Install"]["WantedBy"]; !slices.Equal(got, []string{"multi-user.target"}) {
		t.Errorf("[Install] WantedBy = %q", got)
	}

	// systemd's own check. It insists that ExecStart exists, so it verifies a copy whose ExecStart is the
	// binary that scripts/build-static just built; every other line is the file as shipped.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not found: install systemd: apt-get install -y systemd " +
			"(as root, `make test` does it through scripts/test-deps)")
	}
	bin := staticBinary(t)
	copyPath := filepath.Join(t.TempDir(), "keepwarm.service")
	if err := os.WriteFile(copyPath, bytes.ReplaceAll(raw, []byte("/usr/local/bin/keepwarm"), []byte(bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", copyPath).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func hasBind(s types.ServiceConfig, source, target string) bool {
	abs, _ := filepath.Abs(filepath.Join(root, source))
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Source == abs && v.Target == target && v.ReadOnly {
			return true
		}
	}
	return false
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func deref(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return *s
}

func strconvU(u uint32) string { return strconv.FormatUint(uint64(u), 10) }
