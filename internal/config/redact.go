package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// mask replaces every secret that Redacted, String and LogValue print.
const mask = "xxxxx"

// Secret is a string that never prints: String, GoString, LogValue and MarshalText all give "xxxxx" (or ""
// when empty). Use Value to get the secret itself.
type Secret string

// Value returns the secret.
func (s Secret) Value() string { return string(s) }

// String returns "xxxxx", or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return mask
}

// GoString is String, so that %#v does not print the secret either.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// LogValue masks the secret in slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText masks the secret in JSON, TOML and other encodings.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// RedactedURL returns the Redis URL with its password masked.
func (r Redis) RedactedURL() string { return redactDSN(r.URL) }

// LogValue logs the section without secrets.
func (r Redis) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("mode", r.Mode),
		slog.Any("addresses", r.Addresses),
		slog.String("url", r.RedactedURL()),
		slog.String("username", r.Username),
		slog.Int("db", r.DB),
		slog.Bool("tls", r.TLS.Enabled),
	)
}

// String prints the section without secrets.
func (r Redis) String() string { return fmt.Sprint(r.LogValue()) }

// GoString is String, so that %#v does not print the URL's password either.
func (r Redis) GoString() string { return "config.Redis" + r.String() }

// MarshalJSON encodes the section with its URL's password masked (Password is a Secret already).
func (r Redis) MarshalJSON() ([]byte, error) {
	type plain Redis // drops the methods, so that json.Marshal does not recurse
	p := plain(r)
	p.URL = r.RedactedURL()
	return json.Marshal(p)
}

// RedactedDSN returns the DSN with its password masked, in URL or keyword/value form alike. A DSN that cannot
// be parsed is hidden entirely.
func (p Postgres) RedactedDSN() string { return redactDSN(p.DSN) }

// LogValue logs the section without the DSN's password.
func (p Postgres) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("dsn", p.RedactedDSN()),
		slog.Int("max_conns", int(p.MaxConns)),
		slog.Duration("statement_timeout", p.StatementTimeout),
		slog.Duration("connect_timeout", p.ConnectTimeout),
	)
}

// String prints the section without the DSN's password.
func (p Postgres) String() string { return fmt.Sprint(p.LogValue()) }

// GoString is String, so that %#v does not print the DSN's password either.
func (p Postgres) GoString() string { return "config.Postgres" + p.String() }

// MarshalJSON encodes the section with the DSN's password masked.
func (p Postgres) MarshalJSON() ([]byte, error) {
	type plain Postgres
	q := plain(p)
	q.DSN = p.RedactedDSN()
	return json.Marshal(q)
}

// String is Redacted.
func (c *Config) String() string { return c.Redacted() }

// Redacted returns the effective configuration, defaults included, in TOML, with every secret masked: the
// Redis password and Sentinel password, the password in the Redis URL, and the password in the PostgreSQL DSN.
func (c *Config) Redacted() string {
	var b strings.Builder
	w := func(key string, v any) { fmt.Fprintf(&b, "%s = %s\n", key, tomlValue(v)) }
	b.WriteString("[redis]\n")
	w("mode", c.Redis.Mode)
	if c.Redis.MasterName != "" {
		w("master_name", c.Redis.MasterName)
	}
	if c.Redis.URL != "" {
		w("url", c.Redis.RedactedURL())
	} else {
		w("addresses", c.Redis.Addresses)
	}
	w("username", c.Redis.Username)
	w("password", c.Redis.Password.String())
	if c.Redis.Mode == ModeSentinel {
		w("sentinel_username", c.Redis.SentinelUsername)
		w("sentinel_password", c.Redis.SentinelPassword.String())
	}
	w("db", c.Redis.DB)
	w("pool_size", c.Redis.PoolSize)
	w("dial_timeout", c.Redis.DialTimeout)
	w("read_timeout", c.Redis.ReadTimeout)
	w("write_timeout", c.Redis.WriteTimeout)
	w("notifications", c.Redis.Notifications)
	b.WriteString("\n[redis.tls]\n")
	t := c.Redis.TLS
	w("enabled", t.Enabled)
	w("ca_file", t.CAFile)
	w("cert_file", t.CertFile)
	w("key_file", t.KeyFile)
	w("server_name", t.ServerName)
	w("insecure_skip_verify", t.InsecureSkipVerify)

	b.WriteString("\n[postgres]\n")
	w("dsn", c.Postgres.RedactedDSN())
	w("max_conns", c.Postgres.MaxConns)
	w("statement_timeout", c.Postgres.StatementTimeout)
	w("connect_timeout", c.Postgres.ConnectTimeout)
	w("pool_wait_timeout", c.Postgres.PoolWaitTimeout)

	b.WriteString("\n[daemon]\n")
	w("listen", c.Daemon.Listen)
	w("log_level", strings.ToLower(c.Daemon.LogLevel.String()))
	w("log_format", c.Daemon.LogFormat)

	b.WriteString("\n[changes]\n")
	w("enabled", c.Changes.Enabled)
	if c.Changes.DSN != "" {
		w("dsn", c.Changes.RedactedDSN())
	}
	w("slot", c.Changes.Slot)
	w("publication", c.Changes.Publication)
	w("create_publication", c.Changes.CreatePublication)
	w("visibility_timeout", c.Changes.VisibilityTimeout)
	w("freshness", c.Changes.Freshness)
	w("lease_ttl", c.Changes.LeaseTTL)
	w("gather", c.Changes.Gather)
	w("status_interval", c.Changes.StatusInterval)
	w("max_transaction_changes", c.Changes.MaxTxnChanges)

	for _, ks := range c.Keyspaces {
		b.WriteString("\n[[keyspace]]\n")
		for i := range keyspaceFields {
			if f := &keyspaceFields[i]; f.omit == nil || !f.omit(ks) {
				w(f.Key, f.Value(ks))
			}
		}
	}
	for _, h := range c.Hotkeys {
		b.WriteString("\n[[hotkeys]]\n")
		w("name", h.Name)
		w("keyspace", h.Keyspace)
		if h.File != "" {
			w("file", h.File)
		}
		w("ids", h.IDs)
	}
	for _, s := range c.Schedules {
		b.WriteString("\n[[schedule]]\n")
		w("name", s.Name)
		w("cron", s.Cron)
		if s.Timezone != "" {
			w("timezone", s.Timezone)
		}
		w("keyspace", s.Keyspace)
		switch {
		case s.IDsQuery:
			w("ids_query", true)
		case s.List != "":
			w("list", s.List)
		default:
			w("ids", s.IDs)
		}
		if s.Spread > 0 {
			w("spread", s.Spread)
		}
		if s.Rate > 0 {
			w("rate", s.Rate)
		}
	}
	return b.String()
}

func tomlValue(v any) string {
	switch v := v.(type) {
	case rawTOML:
		return string(v)
	case string:
		if strings.Contains(v, "\n") && !strings.Contains(v, `"""`) && !strings.HasSuffix(v, `"`) {
			return `"""` + "\n" + v + `"""`
		}
		return strconv.Quote(v)
	case time.Duration:
		return strconv.Quote(v.String())
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	default:
		return fmt.Sprint(v)
	}
}

// redactURL masks the password of a URL ("redis://user:pw@host"). A string that does not parse as a URL with a
// scheme is hidden entirely, since it may be a password typed in the wrong place.
func redactURL(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return mask
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), mask)
	}
	q := u.Query()
	changed := false
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, mask)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// kvPassword matches password=... and sslpassword=... in a keyword/value DSN, quoted or not.
var kvPassword = regexp.MustCompile(`(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)

// redactDSN masks the password of a connection string in URL or keyword/value form.
func redactDSN(s string) string {
	if s == "" {
		return ""
	}
	if strings.Contains(s, "://") {
		return redactURL(s)
	}
	return kvPassword.ReplaceAllString(s, "${1}"+mask)
}

// secretsIn returns the secret strings of c's raw values, to scrub from error messages: the passwords, and the
// passwords inside the URL and the DSN.
func secretsIn(r Redis, dsn string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 3 {
			out = append(out, s)
		}
	}
	add(r.Password.Value())
	add(r.SentinelPassword.Value())
	for _, s := range []string{r.URL, dsn} {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok {
				add(pw)
			}
		}
		for _, m := range kvPassword.FindAllStringSubmatch(s, -1) {
			add(strings.Trim(m[2], "'"))
		}
	}
	return out
}
