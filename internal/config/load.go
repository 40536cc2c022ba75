package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/knadh/koanf/parsers/toml/v2"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
	gotoml "github.com/pelletier/go-toml/v2"

	"github.com/keepwarm/keepwarm/warmer"
)

// EnvPrefix starts every environment variable that overrides a config key: KEEPWARM_POSTGRES_DSN sets
// [postgres] dsn, KEEPWARM_REDIS_TLS_CA_FILE sets [redis.tls] ca_file.
const EnvPrefix = "KEEPWARM_"

// ValidationError lists every problem found in a config file, each naming the path of its field
// (`keyspace "track": ttl: "5x" is not a duration`). TOML syntax errors give the line and column.
type ValidationError struct {
	Path     string   // the config file, as given to Load
	Problems []string // in file order
	// Files are the hot-key list files the config names, absolute, whether or not they exist: a daemon whose
	// reload was rejected watches them (reload.Watcher.Also), so that creating a missing list applies the config.
	// Nil for a TOML syntax error.
	Files []string
}

// Error returns "path: problem" for one problem, else "path: N problems:" and one indented problem per line.
func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return e.Path + ": " + e.Problems[0]
	}
	return fmt.Sprintf("%s: %d problems:\n  %s", e.Path, len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Load reads the TOML config file at path, applies KEEPWARM_* environment overrides from os.Environ, reads the
// hotkeys files, applies defaults and validates everything. A file that cannot be read is a plain error; every
// problem with its content comes back together in one *ValidationError.
func Load(path string) (*Config, error) { return LoadEnv(path, os.Environ()) }

// LoadEnv is Load with the environment given as "KEY=value" strings (as os.Environ returns them).
//
// Every key of [redis] (and [redis.tls]), [postgres] and [daemon] can be set from the environment:
// KEEPWARM_<SECTION>_<KEY> in upper case, e.g. KEEPWARM_REDIS_PASSWORD, KEEPWARM_POSTGRES_DSN,
// KEEPWARM_DAEMON_LOG_LEVEL. KEEPWARM_REDIS_ADDRESSES takes a comma-separated list. An environment url replaces
// the file's addresses and the other way round. Empty variables, and KEEPWARM_* variables that name no config
// key (scripts and tests use some), are ignored. [[keyspace]], [[hotkeys]] and [[schedule]] come from the file
// only.
func LoadEnv(path string, environ []string) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("config: read %w", err)
	}
	return parse(path, abs, b, environ)
}

// utf8BOM is the byte order mark some editors (Notepad) put at the start of a UTF-8 file. It is not content:
// parse drops it, as go-toml would otherwise report "invalid character at start of key: ï".
var utf8BOM = []byte("\xef\xbb\xbf")

func parse(path, abs string, b []byte, environ []string) (*Config, error) {
	b = bytes.TrimPrefix(b, utf8BOM)
	k := koanf.New(".")
	if err := k.Load(rawbytes.Provider(b), toml.Parser()); err != nil {
		var de *gotoml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			msg := fmt.Sprintf("line %d, column %d: %s", row, col, strings.TrimPrefix(de.Error(), "toml: "))
			return nil, &ValidationError{Path: path, Problems: []string{msg}}
		}
		msg := strings.TrimPrefix(err.Error(), "toml: ")
		if line := duplicateLine(b, err); line > 0 {
			msg = fmt.Sprintf("line %d: %s", line, msg)
		}
		return nil, &ValidationError{Path: path, Problems: []string{msg}}
	}
	known := envKeys()
	fromEnv := map[string]string{}
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, v string) (string, any) {
			e, ok := known[name]
			if !ok || v == "" {
				return "", nil
			}
			fromEnv[e.path] = name
			if e.kind == kindList {
				var list []any
				for _, s := range strings.Split(v, ",") {
					if s = strings.TrimSpace(s); s != "" {
						list = append(list, s)
					}
				}
				return e.path, list
			}
			return e.path, v
		},
	}), nil)
	if err != nil {
		return nil, fmt.Errorf("config: environment: %w", err)
	}

	d := &decoder{fromEnv: fromEnv}
	c := decode(d, abs, k.Raw())
	if len(d.problems) > 0 {
		secrets := secretsIn(c.Redis, c.Postgres.DSN)
		for i, p := range d.problems {
			for _, s := range secrets {
				p = strings.ReplaceAll(p, s, mask)
			}
			d.problems[i] = p
		}
		ve := &ValidationError{Path: path, Problems: d.problems}
		for _, h := range c.Hotkeys {
			if h.File != "" {
				ve.Files = append(ve.Files, h.File)
			}
		}
		return nil, ve
	}
	c.Notes = d.notes
	return c, nil
}

type envKey struct {
	path string
	kind kind
}

// envKeys maps each environment variable name to the config key it sets. It is derived from the decoder itself
// (decoding an empty config records every key asked for), so it cannot drift from the keys Load accepts.
var envKeys = sync.OnceValue(func() map[string]envKey {
	d := &decoder{known: map[string]kind{}, fromEnv: map[string]string{}}
	decode(d, "", map[string]any{})
	out := map[string]envKey{}
	for path, k := range d.known {
		if k == kindTable {
			continue
		}
		name := EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
		if prev, dup := out[name]; dup {
			panic(fmt.Sprintf("config: keys %q and %q map to the same environment variable %s", prev.path, path, name))
		}
		out[name] = envKey{path: path, kind: k}
	}
	return out
})

// EnvVars returns the environment variables that override config keys, sorted, each with its key
// ("KEEPWARM_REDIS_PASSWORD" -> "redis.password").
func EnvVars() map[string]string {
	out := map[string]string{}
	for name, k := range envKeys() {
		out[name] = k.path
	}
	return out
}

// decode decodes and validates raw into a Config, recording problems in d.
func decode(d *decoder, abs string, raw map[string]any) *Config {
	dir := filepath.Dir(abs)
	root := newTable(d, "", "", raw)
	c := &Config{Path: abs}

	rt := root.sub("redis")
	decodeRedis(rt, dir, &c.Redis)
	pt := root.sub("postgres")
	decodePostgres(pt, &c.Postgres)
	dt := root.sub("daemon")
	decodeDaemon(dt, &c.Daemon)
	decodeFleet(root.sub("fleet"), &c.Fleet)

	names := map[string]bool{}
	keyTemplates := map[string]string{}
	for i, m := range root.array("keyspace") {
		ks := decodeKeyspace(newTable(d, fmt.Sprintf("keyspace #%d", i+1), "", m), c, names, keyTemplates)
		c.Keyspaces = append(c.Keyspaces, ks)
	}
	names = map[string]bool{}
	for i, m := range root.array("hotkeys") {
		c.Hotkeys = append(c.Hotkeys, decodeHotkeys(newTable(d, fmt.Sprintf("hotkeys #%d", i+1), "", m), c, dir, names))
	}
	names = map[string]bool{}
	for i, m := range root.array("schedule") {
		c.Schedules = append(c.Schedules, decodeSchedule(newTable(d, fmt.Sprintf("schedule #%d", i+1), "", m), c, names))
	}
	ct := root.sub("changes")
	decodeChanges(ct, &c.Changes)
	root.done()
	if d.known == nil {
		resolveKeyspaces(d, c)
		checkChanges(ct, c)
	}
	if len(c.Keyspaces) == 0 && d.known == nil {
		root.problem("", "no [[keyspace]]: define at least one")
	}
	return c
}

// resolve makes a path from the config file absolute, relative to the file's directory.
func resolve(dir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

func oneOf(v string, allowed ...string) bool { return slices.Contains(allowed, v) }

// duplicateKey matches go-toml's error for a key given twice, which carries no position.
var duplicateKey = regexp.MustCompile(`^toml: key (.+) is already defined$`)

// duplicateLine finds the line of the second "key =" within one table block for go-toml's duplicate-key
// error, or returns 0.
func duplicateLine(doc []byte, err error) int {
	m := duplicateKey.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	key := m[1]
	seen := false
	for i, line := range strings.Split(string(doc), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "[") {
			seen = false
			continue
		}
		rest, ok := strings.CutPrefix(l, key)
		if !ok {
			rest, ok = strings.CutPrefix(l, strconv.Quote(key))
		}
		if ok && strings.HasPrefix(strings.TrimSpace(rest), "=") {
			if seen {
				return i + 1
			}
			seen = true
		}
	}
	return 0
}

// resolveKeyspaces runs warmer's own check on each keyspace (warmer.KeyspaceConfig.Resolve, which New and
// Update run too), so that Load rejects whatever `run` and `warmup` would, with the same message, and stores
// the effective config, warmer's defaults in, that `validate` shows and `run` uses. A field that decoding
// already reported is not reported again.
func resolveKeyspaces(d *decoder, c *Config) {
	for _, ks := range c.Keyspaces {
		if ks.Name == "" {
			continue
		}
		t := newTable(d, fmt.Sprintf("keyspace %q", ks.Name), "", nil)
		reported := func(field string) bool {
			return slices.ContainsFunc(d.problems, func(p string) bool { return strings.HasPrefix(p, t.label+": "+field+":") })
		}
		r, err := c.WarmerKeyspace(ks, nil).Resolve()
		for _, e := range unjoin(err) {
			var fe *warmer.FieldError
			switch {
			case !errors.As(e, &fe):
				t.problem("", "%v", e)
			case fe.Field == "keys" || fe.Field == "name" || reported(fe.Field):
				// a template or name problem, reported by decodeKeyspace
			default:
				t.problem(fe.Field, "%s", fe.Msg)
			}
		}
		if err == nil {
			r.Src, r.Pinned = nil, nil // WarmerKeyspace's to set
			ks.KeyspaceConfig = r
			if n := r.LeadNote(); n != "" {
				d.notes = append(d.notes, n)
			}
		}
	}
}
