package config

import (
	"log/slog"
	"slices"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// Defaults applied by Load. Durations are in their natural unit; sizes in bytes.
const (
	DefaultRedisMode         = ModeSingle
	DefaultRedisDialTimeout  = 5 * time.Second
	DefaultRedisReadTimeout  = 3 * time.Second
	DefaultRedisWriteTimeout = 3 * time.Second

	DefaultPostgresMaxConns         = 8
	DefaultPostgresStatementTimeout = warmer.DefaultStatementTimeout // also a zero KeyspaceConfig.StatementTimeout
	DefaultPostgresConnectTimeout   = 5 * time.Second

	DefaultListen    = "127.0.0.1:9471"
	DefaultLogLevel  = "info"
	DefaultLogFormat = "json"

	// Floors of the timeouts: a daemon with "1ns" timeouts would never become ready, so validate refuses them.
	MinRedisTimeout   = time.Millisecond       // [redis] read_timeout, write_timeout
	MinConnectTimeout = 100 * time.Millisecond // [redis] dial_timeout, [postgres] connect_timeout

	// MaxRedisPoolSize bounds [redis] pool_size: go-redis allocates a pool's slots when it builds the client, and
	// 2147483647 of them exhausted memory before the daemon started.
	MaxRedisPoolSize = 100000

	// Keyspace defaults and bounds are warmer's, on warmer.KeyspaceConfig: KeyspaceFields says which applies
	// to each [[keyspace]] key.
)

// Keyspace notifications settings ([redis] notifications).
const (
	NotificationsOn   = "on"   // subscribe, check notify-keyspace-events and report it (the default)
	NotificationsAuto = "auto" // as on, and add the missing flags with CONFIG SET where the ACL allows
	NotificationsOff  = "off"  // do not subscribe: PTTL reconciliation alone tracks expiries

	DefaultNotifications = NotificationsOn
)

// Redis modes.
const (
	ModeSingle   = "single"
	ModeSentinel = "sentinel"
	ModeCluster  = "cluster"
)

// Config is keepwarm's configuration, as loaded, defaulted and validated by Load. Treat it as read-only.
// Printing it or its sections (%v, %#v, String, Redacted, slog, JSON) never shows a secret: passwords are Secret
// values, and the sections mask the password inside Redis.URL and Postgres.DSN. Only reading those two fields
// directly gives the raw connection strings, for connecting.
type Config struct {
	Path      string // the config file, absolute; relative paths inside it are resolved against its directory
	Redis     Redis
	Postgres  Postgres
	Daemon    Daemon
	Fleet     Fleet       // [fleet]
	Keyspaces []*Keyspace // [[keyspace]], in file order
	Hotkeys   []*Hotkeys  // [[hotkeys]], in file order
	Schedules []*Schedule // [[schedule]], in file order
	Changes   Changes     // [changes]
	// Notes says which of two sources of a setting won, e.g. "redis: url from KEEPWARM_REDIS_URL replaces the
	// file's addresses (...)". `validate` prints them and `run` logs them.
	Notes []string
}

// Redis is the [redis] section: how keepwarm connects to Redis. RedisOptions turns it into go-redis options.
type Redis struct {
	Mode             string        // ModeSingle (default), ModeSentinel or ModeCluster
	MasterName       string        // the Sentinel master name; required in sentinel mode only
	Addresses        []string      // host:port; single mode: exactly one; sentinel: the Sentinels; cluster: seed nodes
	URL              string        // instead of Addresses in single and cluster modes: redis://[user:pass@]host:port[/db], rediss:// for TLS
	Username         string        // ACL user; "" uses the URL's or none
	Password         Secret        // ACL password; overrides the URL's; set it with KEEPWARM_REDIS_PASSWORD
	SentinelUsername string        // sentinel mode: the Sentinels' own ACL user
	SentinelPassword Secret        // sentinel mode: the Sentinels' own password
	DB               int           // database number; must be 0 in cluster mode
	TLS              TLS           // [redis.tls]
	PoolSize         int           // connections per node; 0 means go-redis's default (10 per CPU)
	DialTimeout      time.Duration // default DefaultRedisDialTimeout
	ReadTimeout      time.Duration // default DefaultRedisReadTimeout
	WriteTimeout     time.Duration // default DefaultRedisWriteTimeout
	// Notifications is NotificationsOn (default), NotificationsAuto or NotificationsOff: whether the daemon
	// subscribes to keyspace notifications (on every Cluster master), and whether it sets the notify-keyspace-events
	// flags it needs itself (warmer.Config.Notifications and AutoNotifyFlags).
	Notifications string
}

// TLS is the [redis.tls] section. File paths are absolute after Load.
type TLS struct {
	Enabled            bool   // use TLS (a rediss:// URL turns it on too)
	CAFile             string // PEM CA bundle to verify the server; "" uses the system roots
	CertFile           string // PEM client certificate, for mutual TLS; needs KeyFile
	KeyFile            string // PEM client key
	ServerName         string // name to verify in the server certificate; default: the host dialled
	InsecureSkipVerify bool   // do not verify the server certificate (tests only)
}

// Postgres is the [postgres] section. TLS is set in the DSN (sslmode=verify-full sslrootcert=/path/ca.pem, and
// sslcert/sslkey for client certificates).
type Postgres struct {
	DSN              string        // postgres:// URL or keyword/value string; set it with KEEPWARM_POSTGRES_DSN to keep the password out of the file
	MaxConns         int32         // pool size; default DefaultPostgresMaxConns
	StatementTimeout time.Duration // bound on each fetch query; default DefaultPostgresStatementTimeout
	ConnectTimeout   time.Duration // bound on each connection attempt; default DefaultPostgresConnectTimeout
	// PoolWaitTimeout (pool_wait_timeout) bounds a fetch's wait for a free pool connection; when it runs out the
	// fetch fails with "pool exhausted (max_conns N)". Its default (1s) and bounds (10ms to 1m) are
	// postgres.Config.PoolWaitTimeout's: postgres.DefaultPoolWaitTimeout, MinPoolWaitTimeout and MaxPoolWaitTimeout.
	PoolWaitTimeout time.Duration
}

// Daemon is the [daemon] section.
type Daemon struct {
	Listen    string     // HTTP address for /metrics, /healthz and /readyz; default DefaultListen
	LogLevel  slog.Level // from log_level: debug, info (default), warn or error
	LogFormat string     // "json" (default) or "text"
}

// Hotkeys is one [[hotkeys]] list: ids pinned in a keyspace, always kept warm.
type Hotkeys struct {
	Name     string   // unique among lists
	Keyspace string   // the keyspace the ids belong to
	IDs      []string // the inline ids followed by the file's, duplicates removed
	File     string   // absolute path of the ids file, or ""
	// Skipped are the File's lines that are not valid ids, as "file:line: error", in file order. They are left
	// out of IDs rather than making the config invalid: validate lists them, run warns once and warms the rest.
	Skipped []string
}

// Schedule is one [[schedule]]: a cron-driven warmup.
type Schedule struct {
	Name     string        // unique among schedules
	Cron     string        // as written, e.g. "0 0 3 * * *" or "CRON_TZ=Europe/Paris @daily"
	Timezone string        // IANA zone for Cron; "" means the daemon's local zone (or Cron's CRON_TZ=)
	Keyspace string        // the keyspace warmed
	IDs      []string      // inline ids, or
	IDsQuery bool          // the keyspace's ids_query, or
	List     string        // the ids of this [[hotkeys]] list
	Spread   time.Duration // spread the run's writes over this window; 0 means as fast as Rate allows
	Rate     float64       // ids per second; 0 means unlimited
	// DSTGap is what happens to a run whose local time a daylight-saving change skips: DSTGapRun (the default:
	// run it at the first valid time after the gap and log it, as cronie does; robfig/cron alone skips it, see
	// robfig/cron PR #541) or DSTGapSkip (log it and skip it).
	DSTGap string
	// MinInterval (min_interval) is the floor on the time between two runs: a cron that fires more often is
	// refused ("@every 0s" fires every second). Default DefaultScheduleMinInterval; at least 1s.
	MinInterval time.Duration

	spec *warmer.CronSchedule
}

// dst_gap values.
const (
	DSTGapSkip = "skip"
	DSTGapRun  = "run"

	DefaultDSTGap = DSTGapRun // warmer's own default: ScheduleConfig.SkipDSTGap false
)

// DefaultScheduleMinInterval is the default [[schedule]] min_interval.
const DefaultScheduleMinInterval = time.Minute

// Spec returns the parsed cron schedule, time zone included: parsed once, by warmer.ParseCron, when the config
// is loaded.
func (s *Schedule) Spec() *warmer.CronSchedule { return s.spec }

// CronSpec returns Cron with the time zone folded in ("CRON_TZ=Europe/Paris 0 0 3 * * *"), as
// warmer.ParseCron reads it.
func (s *Schedule) CronSpec() string {
	if s.Timezone != "" {
		return "CRON_TZ=" + s.Timezone + " " + s.Cron
	}
	return s.Cron
}

// Keyspace returns the keyspace named name, or nil.
func (c *Config) Keyspace(name string) *Keyspace {
	for _, ks := range c.Keyspaces {
		if ks.Name == name {
			return ks
		}
	}
	return nil
}

// Pinned returns the ids pinned in keyspace by its [[hotkeys]] lists: their union, in file order, without
// duplicates. It returns nil for a keyspace with no lists.
func (c *Config) Pinned(keyspace string) []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range c.Hotkeys {
		if h.Keyspace != keyspace {
			continue
		}
		for _, id := range h.IDs {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out
}

// SchedulesFor returns the schedules that warm keyspace, in file order.
func (c *Config) SchedulesFor(keyspace string) []*Schedule {
	var out []*Schedule
	for _, s := range c.Schedules {
		if s.Keyspace == keyspace {
			out = append(out, s)
		}
	}
	return out
}

// HotkeysList returns the [[hotkeys]] list named name, or nil.
func (c *Config) HotkeysList(name string) *Hotkeys {
	i := slices.IndexFunc(c.Hotkeys, func(h *Hotkeys) bool { return h.Name == name })
	if i < 0 {
		return nil
	}
	return c.Hotkeys[i]
}
