package config

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	_ "time/tzdata" // schedules name IANA zones; do not depend on the host having them

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
	pgsource "github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/warmer"
)

func decodeRedis(t *table, dir string, r *Redis) {
	r.Mode = DefaultRedisMode
	r.DialTimeout, r.ReadTimeout, r.WriteTimeout = DefaultRedisDialTimeout, DefaultRedisReadTimeout, DefaultRedisWriteTimeout
	t.str("mode", &r.Mode)
	t.str("master_name", &r.MasterName)
	hasAddrs := t.strs("addresses", &r.Addresses)
	hasURL := t.str("url", &r.URL)
	t.str("username", &r.Username)
	t.secret("password", &r.Password)
	t.str("sentinel_username", &r.SentinelUsername)
	t.secret("sentinel_password", &r.SentinelPassword)
	hasDB := t.integer("db", &r.DB)
	t.integer("pool_size", &r.PoolSize)
	floor(t, "dial_timeout", &r.DialTimeout, MinConnectTimeout, "a TCP (and TLS) handshake cannot finish sooner, and every connection attempt would fail")
	floor(t, "read_timeout", &r.ReadTimeout, MinRedisTimeout, "even a loopback round trip can take that long, and every command would fail")
	floor(t, "write_timeout", &r.WriteTimeout, MinRedisTimeout, "even a loopback round trip can take that long, and every command would fail")
	r.Notifications = DefaultNotifications
	t.str("notifications", &r.Notifications)
	tt := t.sub("tls")
	tlsSet := decodeTLS(tt, dir, &r.TLS)
	tt.done()
	t.done()
	if t.d.known != nil {
		return // only recording the keys
	}

	if !oneOf(r.Notifications, NotificationsOn, NotificationsAuto, NotificationsOff) {
		t.problem("notifications", "%q is not a setting: want %q, %q or %q", r.Notifications, NotificationsOn,
			NotificationsAuto, NotificationsOff)
	}
	if !oneOf(r.Mode, ModeSingle, ModeSentinel, ModeCluster) {
		t.problem("mode", "%q is not a mode: want %q, %q or %q", r.Mode, ModeSingle, ModeSentinel, ModeCluster)
	}
	if hasAddrs && hasURL {
		_, urlEnv := t.d.fromEnv["redis.url"]
		_, addrsEnv := t.d.fromEnv["redis.addresses"]
		switch {
		case urlEnv && !addrsEnv:
			t.d.notes = append(t.d.notes, fmt.Sprintf("redis: url from %s replaces the file's addresses (%s)",
				t.d.fromEnv["redis.url"], strings.Join(r.Addresses, ", ")))
			r.Addresses, hasAddrs = nil, false
		case addrsEnv && !urlEnv:
			t.d.notes = append(t.d.notes, fmt.Sprintf("redis: addresses from %s replace the file's url",
				t.d.fromEnv["redis.addresses"]))
			r.URL, hasURL = "", false
		default:
			t.problem("", "set addresses or url, not both")
		}
	}
	if !hasAddrs && !hasURL {
		t.problem("", "set addresses (a list of host:port) or url (redis://host:port/db)")
	}
	for i, a := range r.Addresses {
		if !validHostPort(a) {
			t.problem(fmt.Sprintf("addresses[%d]", i), "%q is not host:port", a)
		}
	}
	if hasAddrs && len(r.Addresses) == 0 {
		t.problem("addresses", "is empty")
	}
	if hasURL {
		urlTLS, urlDB, err := checkRedisURL(r.Mode, r.URL)
		switch {
		case err != nil:
			t.problem("url", "%v", err)
		default:
			r.TLS.Enabled = r.TLS.Enabled || urlTLS
			_, urlEnv := t.d.fromEnv["redis.url"]
			_, dbEnv := t.d.fromEnv["redis.db"]
			switch {
			case !hasDB:
				r.DB = urlDB
			case r.DB == urlDB || urlDB == 0:
			case urlEnv && !dbEnv:
				// The environment's url wins over the file's db, as it wins over the file's addresses.
				t.d.notes = append(t.d.notes, fmt.Sprintf("redis: database %d from %s replaces the file's db = %d",
					urlDB, t.d.fromEnv["redis.url"], r.DB))
				r.DB = urlDB
			default:
				t.problem("db", "%d differs from the url's database %d", r.DB, urlDB)
			}
		}
	}
	switch r.Mode {
	case ModeSingle:
		if len(r.Addresses) > 1 {
			t.problem("addresses", "single mode takes one address, got %d; for Redis Cluster set mode = %q", len(r.Addresses), ModeCluster)
		}
	case ModeSentinel:
		if r.MasterName == "" {
			t.problem("master_name", "required in sentinel mode")
		}
	case ModeCluster:
		if r.DB != 0 {
			t.problem("db", "must be 0 in cluster mode, got %d", r.DB)
		}
	}
	if r.Mode != ModeSentinel {
		if r.MasterName != "" {
			t.problem("master_name", "is only used in sentinel mode (mode is %q)", r.Mode)
		}
		if r.SentinelUsername != "" || r.SentinelPassword != "" {
			t.problem("", "sentinel_username and sentinel_password are only used in sentinel mode (mode is %q)", r.Mode)
		}
	}
	if r.DB < 0 {
		t.problem("db", "must be 0 or more, got %d", r.DB)
	}
	if r.PoolSize < 0 || r.PoolSize > MaxRedisPoolSize {
		t.problem("pool_size", "%d is not in [0, %d] (0: the go-redis default, 10 per CPU); go-redis allocates the pool's slots up front",
			r.PoolSize, MaxRedisPoolSize)
	}
	switch {
	case !r.TLS.Enabled && tlsSet != "":
		tt.problem("enabled", "is false but %s is set: set enabled = true (or use a rediss:// url)", tlsSet)
	case r.TLS.Enabled:
		if _, err := r.TLS.Config(); err != nil {
			tt.problem("", "%v", err)
		}
	}
}

// decodeTLS returns the name of the first key, other than enabled, that is set.
func decodeTLS(t *table, dir string, c *TLS) string {
	t.boolean("enabled", &c.Enabled)
	var set []string
	for _, f := range []struct {
		key string
		dst *string
	}{{"ca_file", &c.CAFile}, {"cert_file", &c.CertFile}, {"key_file", &c.KeyFile}, {"server_name", &c.ServerName}} {
		if t.str(f.key, f.dst) {
			set = append(set, f.key)
		}
	}
	if t.boolean("insecure_skip_verify", &c.InsecureSkipVerify) && c.InsecureSkipVerify {
		set = append(set, "insecure_skip_verify")
	}
	c.CAFile, c.CertFile, c.KeyFile = resolve(dir, c.CAFile), resolve(dir, c.CertFile), resolve(dir, c.KeyFile)
	if len(set) == 0 {
		return ""
	}
	return set[0]
}

// checkRedisURL parses a [redis] url for mode, returning whether it asks for TLS and the database it names.
// The error never quotes the URL, which may hold a password.
func checkRedisURL(mode, raw string) (tls bool, db int, err error) {
	scrub := func(err error) error {
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err
		}
		return err
	}
	switch mode {
	case ModeSentinel:
		return false, 0, errors.New("not supported in sentinel mode: list the Sentinels in addresses and set master_name")
	case ModeCluster:
		o, err := redis.ParseClusterURL(raw)
		if err != nil {
			return false, 0, scrub(err)
		}
		for _, a := range o.Addrs {
			if !validHostPort(a) {
				return false, 0, fmt.Errorf("address %q is not host:port with a port in [1, 65535]", a)
			}
		}
		return o.TLSConfig != nil, 0, nil
	default:
		o, err := redis.ParseURL(raw)
		if err != nil {
			return false, 0, scrub(err)
		}
		if !validHostPort(o.Addr) {
			return false, 0, fmt.Errorf("address %q is not host:port with a port in [1, 65535]", o.Addr)
		}
		if o.DB < 0 {
			return false, 0, fmt.Errorf("the database number in its path is %d: want 0 or more (redis://host:port/0)", o.DB)
		}
		return o.TLSConfig != nil, o.DB, nil
	}
}

func validHostPort(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 65536
}

func decodePostgres(t *table, p *Postgres) {
	p.StatementTimeout, p.ConnectTimeout = DefaultPostgresStatementTimeout, DefaultPostgresConnectTimeout
	maxConns := DefaultPostgresMaxConns
	hasDSN := t.str("dsn", &p.DSN)
	t.integer("max_conns", &maxConns)
	t.duration("statement_timeout", &p.StatementTimeout)
	floor(t, "connect_timeout", &p.ConnectTimeout, MinConnectTimeout, "a TCP, TLS and authentication handshake cannot finish sooner, and every connection attempt would fail")
	p.PoolWaitTimeout = pgsource.DefaultPoolWaitTimeout
	if floor(t, "pool_wait_timeout", &p.PoolWaitTimeout, pgsource.MinPoolWaitTimeout, "a busy pool hands a connection over in about that long, and nearly every fetch would fail as pool exhausted") &&
		p.PoolWaitTimeout > pgsource.MaxPoolWaitTimeout {
		t.problem("pool_wait_timeout", "%s is more than %s: a pool that busy needs more max_conns, not a longer wait",
			p.PoolWaitTimeout, pgsource.MaxPoolWaitTimeout)
	}
	t.done()
	if t.d.known != nil {
		return
	}
	p.MaxConns = int32(maxConns)
	switch {
	case !hasDSN && t.has("dsn"):
	case !hasDSN || p.DSN == "":
		t.problem("dsn", "missing: set it here or in %sPOSTGRES_DSN", EnvPrefix)
	default:
		if err := pgsource.ParseDSN(p.DSN); err != nil {
			t.problem("dsn", "cannot parse: %v", err)
		}
	}
	if maxConns < 1 {
		t.problem("max_conns", "must be at least 1, got %d", maxConns)
	}
}

// floor reads the duration key into dst, like table.duration, and reports a value below min, saying why with
// the reason given. It returns whether the key was set and valid.
func floor(t *table, key string, dst *time.Duration, min time.Duration, why string) bool {
	if !t.duration(key, dst) {
		return false
	}
	if *dst < min {
		t.problem(key, "%v is below the floor of %v: %s", *dst, min, why)
		return false
	}
	return true
}

func decodeDaemon(t *table, d *Daemon) {
	d.Listen, d.LogFormat = DefaultListen, DefaultLogFormat
	level := DefaultLogLevel
	t.str("listen", &d.Listen)
	t.str("log_level", &level)
	t.str("log_format", &d.LogFormat)
	t.done()
	if t.d.known != nil {
		return
	}
	// Port 0 asks the kernel for a free port (tests, several daemons on one host); the bound address is logged.
	// An empty host (":9471") listens on every interface.
	if host, port, err := net.SplitHostPort(d.Listen); err != nil {
		t.problem("listen", "%q is not host:port", d.Listen)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		t.problem("listen", "%q: port %q is not a number in [0, 65535]", d.Listen, port)
	} else if err := listenHost(host); err != nil {
		t.problem("listen", "%q: %v", d.Listen, err)
	}
	switch strings.ToLower(level) {
	case "debug":
		d.LogLevel = slog.LevelDebug
	case "info":
		d.LogLevel = slog.LevelInfo
	case "warn":
		d.LogLevel = slog.LevelWarn
	case "error":
		d.LogLevel = slog.LevelError
	default:
		t.problem("log_level", "%q is not a level: want debug, info, warn or error", level)
	}
	if !oneOf(d.LogFormat, "json", "text") {
		t.problem("log_format", "%q is not a format: want json or text", d.LogFormat)
	}
}

// listenTimeout bounds the name lookup of a listen host that is not an IP address.
const listenTimeout = 2 * time.Second

// listenHost checks that the daemon can bind to host: empty (every interface), an IP address, or a name that
// resolves. A name of digits and dots only is a mistyped IPv4 address ("256.0.0.1"), not looked up.
func listenHost(host string) error {
	if host == "" {
		return nil
	}
	if ip, _, _ := strings.Cut(host, "%"); net.ParseIP(ip) != nil { // an IPv6 zone: "fe80::1%eth0"
		return localIP(host)
	}
	if strings.Trim(host, "0123456789.") == "" {
		return fmt.Errorf("host %q is not an IPv4 address", host)
	}
	if strings.Contains(host, ":") {
		return fmt.Errorf("host %q is not an IPv6 address", host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), listenTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return fmt.Errorf("host %q does not resolve: use an IP address such as 127.0.0.1, or a name in /etc/hosts", host)
	}
	for _, a := range addrs {
		if localIP(a) == nil {
			return nil
		}
	}
	return fmt.Errorf("host %q resolves to %s, none of this host's addresses", host, strings.Join(addrs, ", "))
}

// localIP checks that the daemon can bind to ip (zone allowed): the unspecified address (every interface), a
// loopback address, or an address of one of this host's interfaces; not a multicast or broadcast address.
func localIP(s string) error {
	addr, zone, _ := strings.Cut(s, "%")
	ip := net.ParseIP(addr)
	switch {
	case ip == nil:
		return fmt.Errorf("host %q is not an IP address", s)
	case ip.IsUnspecified() || (ip.IsLoopback() && zone == ""):
		return nil
	case ip.IsMulticast() || ip.Equal(net.IPv4bcast):
		return fmt.Errorf("host %q is a multicast or broadcast address, which cannot be listened on", s)
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil // cannot tell: let the bind decide
	}
	for _, ifc := range ifaces {
		if zone != "" && ifc.Name != zone {
			continue
		}
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return nil
			}
		}
	}
	return fmt.Errorf("host %q is not an address of this host (%s): use 127.0.0.1, 0.0.0.0 or one of its interfaces' addresses",
		s, "see `ip addr`")
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// name reads the name of an array-of-tables entry, relabels t after it and checks it is valid and unique.
func name(t *table, what string, dst *string, seen map[string]bool) bool {
	if !t.str("name", dst) || *dst == "" {
		if !t.has("name") || *dst == "" {
			t.problem("name", "missing (required)")
		}
		return false
	}
	t.label = fmt.Sprintf("%s %q", what, *dst)
	if !nameRE.MatchString(*dst) {
		t.problem("name", "%q: use letters, digits, '_', '-' and '.' (up to 64, starting with a letter or digit)", *dst)
	}
	if seen[*dst] {
		t.problem("name", "%q is used by another [[%s]]", *dst, what)
	}
	seen[*dst] = true
	return true
}

func decodeHotkeys(t *table, c *Config, dir string, names map[string]bool) *Hotkeys {
	h := &Hotkeys{}
	name(t, "hotkeys", &h.Name, names)
	hasKS := t.str("keyspace", &h.Keyspace)
	var inline []string
	hasIDs := t.strs("ids", &inline)
	var file string
	hasFile := t.str("file", &file)
	t.done()

	ks := keyspaceRef(t, c, hasKS, h.Keyspace)
	if !hasIDs && !hasFile {
		t.problem("", "set ids (a list) or file (one id per line)")
	}
	seen := map[string]bool{}
	add := func(id string) {
		if !seen[id] {
			seen[id] = true
			h.IDs = append(h.IDs, id)
		}
	}
	for i, id := range inline {
		if err := checkID(ks, id); err != nil {
			t.problem(fmt.Sprintf("ids[%d]", i), "%v", err)
			continue
		}
		add(id)
	}
	if hasFile {
		if file == "" {
			t.problem("file", "is empty")
			return h
		}
		h.File = resolve(dir, file)
		ids, skipped, err := readIDs(h.File, file, func(id string) error { return checkID(ks, id) })
		for _, e := range unjoin(err) {
			t.problem("file", "%v", e)
		}
		h.Skipped = skipped
		for _, id := range ids {
			add(id)
		}
	}
	return h
}

// readIDs reads a hotkeys file: one id per line, surrounding spaces trimmed, blank lines and lines starting
// with # skipped. A line that is not a valid id (check fails with lockstep.ErrInvalidID or postgres.ErrInvalidID,
// such as a NUL byte, or the line is longer than an id can be) does not make the file invalid: it comes back in
// skipped as "file:line: error", so that one bad line in a list of 10,000 ids leaves the other 9,999 warm. err
// is for a file that cannot be read, and for check errors other than an invalid id. Errors name the file as written in the config, and the line.
func readIDs(path, shown string, check func(string) error) (ids, skipped []string, err error) {
	// Only a regular file: opening a FIFO blocks until a writer comes, and /dev/zero never ends.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: is not a regular file (%s)", shown, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, nil, fmt.Errorf("%s: %w", shown, pe.Err)
		}
		return nil, nil, err
	}
	defer f.Close()
	var errs []error
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, n, err := readLine(r, 2*lockstep.MaxIDBytes)
		if err == io.EOF {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", shown, line, err))
			break
		}
		s := strings.TrimSpace(string(b))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if n > len(b) {
			err = fmt.Errorf("%w: line longer than %d bytes, and an id has at most %d", lockstep.ErrInvalidID, len(b), lockstep.MaxIDBytes)
		} else {
			err = check(s)
		}
		switch {
		case err == nil:
			ids = append(ids, s)
		case errors.Is(err, lockstep.ErrInvalidID), errors.Is(err, pgsource.ErrInvalidID):
			skipped = append(skipped, fmt.Sprintf("%s:%d: %v", shown, line, err))
		default:
			errs = append(errs, fmt.Errorf("%s:%d: %w", shown, line, err))
		}
	}
	return ids, skipped, errors.Join(errs...)
}

// readLine returns r's next line without its line ending, keeping at most limit bytes of it, and the line's
// full length n (with the ending), however long the line is. err is io.EOF after the last line.
func readLine(r *bufio.Reader, limit int) (line []byte, n int, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		n += len(chunk)
		if room := limit - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && n == 0:
			return nil, 0, io.EOF
		case err != nil && err != io.EOF:
			return nil, n, err
		}
		trimmed := bytes.TrimRight(line, "\r\n")
		return trimmed, n - (len(line) - len(trimmed)), nil
	}
}

func decodeSchedule(t *table, c *Config, names map[string]bool) *Schedule {
	s := &Schedule{}
	name(t, "schedule", &s.Name, names)
	hasCron := t.str("cron", &s.Cron)
	t.str("timezone", &s.Timezone)
	hasKS := t.str("keyspace", &s.Keyspace)
	hasIDs := t.strs("ids", &s.IDs)
	t.boolean("ids_query", &s.IDsQuery)
	hasList := t.str("list", &s.List)
	t.duration("spread", &s.Spread)
	t.float("rate", &s.Rate)
	s.DSTGap = DefaultDSTGap
	t.str("dst_gap", &s.DSTGap)
	s.MinInterval = DefaultScheduleMinInterval
	hasMin := floor(t, "min_interval", &s.MinInterval, time.Second,
		"robfig/cron fires at most once a second, and a warmup that often is a load test, not a warmup")
	t.done()
	if !oneOf(s.DSTGap, DSTGapSkip, DSTGapRun) {
		t.problem("dst_gap", "%q is not a choice: want %q (log and skip a run whose local time a daylight-saving change skips) or %q (run it right after the gap)",
			s.DSTGap, DSTGapSkip, DSTGapRun)
	}

	tzOK := true
	if s.Timezone != "" {
		if strings.HasPrefix(s.Cron, "CRON_TZ=") || strings.HasPrefix(s.Cron, "TZ=") {
			t.problem("timezone", "set either timezone or a CRON_TZ= prefix in cron, not both")
			tzOK = false
		} else if _, err := time.LoadLocation(s.Timezone); err != nil || s.Timezone == "Local" {
			t.problem("timezone", "%q is not an IANA time zone such as \"Europe/Paris\" or \"UTC\"", s.Timezone)
			tzOK = false
		}
	}
	switch {
	case !hasCron && t.has("cron"):
	case !hasCron || strings.TrimSpace(s.Cron) == "":
		t.problem("cron", "missing (required): e.g. \"0 3 * * *\" (minute hour dom month dow, seconds optional first) or \"@every 10m\"")
	case tzOK:
		spec, err := warmer.ParseCron(s.CronSpec())
		if err != nil {
			t.problem("cron", "%v", err)
			break
		}
		s.spec = spec
		if gap := spec.MinInterval(); gap > 0 && gap < s.MinInterval {
			how := "lower min_interval"
			if hasMin {
				how = "min_interval is " + s.MinInterval.String()
			}
			t.problem("cron", "%q fires every %v, more often than the floor of %v: each run reads every id from the origin and writes every key (%s to allow it)",
				s.Cron, gap, s.MinInterval, how)
		}
	}

	ks := keyspaceRef(t, c, hasKS, s.Keyspace)
	n := 0
	for _, set := range []bool{hasIDs, s.IDsQuery, hasList} {
		if set {
			n++
		}
	}
	if n != 1 {
		t.problem("", "set exactly one of ids (a list), ids_query = true (the keyspace's ids_query) or list (a [[hotkeys]] name)")
	}
	if hasIDs && len(s.IDs) == 0 {
		t.problem("ids", "is empty")
	}
	for i, id := range s.IDs {
		if err := checkID(ks, id); err != nil {
			t.problem(fmt.Sprintf("ids[%d]", i), "%v", err)
		}
	}
	if s.IDsQuery && ks != nil && ks.IDsQuery == "" {
		t.problem("ids_query", "keyspace %q has no ids_query", ks.Name)
	}
	if hasList {
		switch h := c.HotkeysList(s.List); {
		case h == nil:
			t.problem("list", "%q is not a [[hotkeys]] name%s", s.List, known(hotkeysNames(c)))
		case h.Keyspace != s.Keyspace:
			t.problem("list", "%q pins ids of keyspace %q, not %q", s.List, h.Keyspace, s.Keyspace)
		}
	}
	if s.Rate < 0 {
		t.problem("rate", "must be 0 (unlimited) or more, got %g", s.Rate)
	}
	return s
}

// keyspaceRef checks that a [[hotkeys]] or [[schedule]] names a keyspace that exists, and returns it.
func keyspaceRef(t *table, c *Config, has bool, name string) *Keyspace {
	if !has || name == "" {
		if !t.has("keyspace") || name == "" {
			t.problem("keyspace", "missing (required)")
		}
		return nil
	}
	ks := c.Keyspace(name)
	if ks == nil {
		var names []string
		for _, k := range c.Keyspaces {
			names = append(names, k.Name)
		}
		t.problem("keyspace", "%q is not a [[keyspace]] name%s", name, known(names))
	}
	return ks
}

func hotkeysNames(c *Config) []string {
	var out []string
	for _, h := range c.Hotkeys {
		out = append(out, h.Name)
	}
	return out
}

func known(names []string) string {
	if len(names) == 0 {
		return " (there are none)"
	}
	return " (known: " + strings.Join(names, ", ") + ")"
}

// checkID validates a pinned or scheduled id against its keyspace's templates (or alone when the keyspace is
// unknown), then against what PostgreSQL text can hold (postgres.ValidID: no NUL byte), since every keyspace's
// source is PostgreSQL. The error wraps lockstep.ErrInvalidID or postgres.ErrInvalidID.
func checkID(ks *Keyspace, id string) error {
	var err error
	if ks != nil && ks.Keys() != nil {
		_, err = ks.Keys().For(id)
	} else {
		err = lockstep.ValidateID(id)
	}
	if err != nil {
		return err
	}
	return pgsource.ValidID(id)
}

// unjoin splits an errors.Join into its errors.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
