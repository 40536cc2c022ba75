package config

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	pgsource "github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
	"github.com/keepwarm/keepwarm/warmer"
)

// Changes is the [changes] section: change-driven refresh from PostgreSQL logical replication (sources/postgres
// Stream). The keyspaces it feeds say so with on_change and fed_by.
type Changes struct {
	Enabled bool // stream changes; default false
	// DSN of the primary, for the replication connection; "" uses [postgres] dsn. Set it when [postgres] dsn is
	// a read replica (then every refresh first waits for the replica to replay the commit). Keep a password in
	// KEEPWARM_CHANGES_DSN.
	DSN               string
	Slot              string // the permanent replication slot keepwarm owns; default stream.DefaultSlot
	Publication       string // default stream.DefaultPublication
	CreatePublication bool   // create the publication, or add missing tables, at start; default true
	// VisibilityTimeout bounds the wait for a batch's commits to become visible before they are refreshed
	// (warmer.ChangesConfig.VisibilityTimeout); default warmer.DefaultVisibilityTimeout, in (0, 1m]. The key's old
	// name, replay_timeout, is still read.
	VisibilityTimeout time.Duration
	// Freshness is the freshness SLO's bound (warmer.ChangesConfig.Freshness); default warmer.DefaultFreshness,
	// in [100ms, 1m].
	Freshness time.Duration
	LeaseTTL  time.Duration // the fleet's stream lease; default stream.DefaultLeaseTTL
	// Gather is how long the first transaction of a batch waits for more before the batch is applied, so that
	// bursts of updates of one row coalesce into one rebuild; default stream.DefaultGather.
	Gather time.Duration
	// StatusInterval is how often the stream sends PostgreSQL a standby status update when nothing else is due;
	// default stream.DefaultStatusInterval, in [100ms, 30s]: well below wal_sender_timeout (60 s by default),
	// which ends a replication connection that has been silent that long.
	StatusInterval time.Duration
	// MaxTxnChanges caps the row changes kept of one transaction; a larger one refreshes every hot key instead
	// (stream.Config.MaxTxnChanges); default stream.DefaultMaxTxnChanges, in [1000, 10000000].
	MaxTxnChanges int
}

// RedactedDSN returns DSN with any password masked.
func (c Changes) RedactedDSN() string { return redactDSN(c.DSN) }

// LogValue logs the section with the DSN's password masked.
func (c Changes) LogValue() slog.Value {
	return slog.GroupValue(slog.Bool("enabled", c.Enabled), slog.String("dsn", c.RedactedDSN()),
		slog.String("slot", c.Slot), slog.String("publication", c.Publication))
}

// String is LogValue's text.
func (c Changes) String() string { return fmt.Sprint(c.LogValue()) }

// GoString never shows the password.
func (c Changes) GoString() string { return "config.Changes" + c.String() }

// Feed is one fed_by entry of a keyspace: a change to a row of Table refreshes the id held in column ID.
type Feed struct {
	Table string // "schema.table" after Load ("track" becomes "public.track")
	ID    string // the column holding the keyspace's id
}

// Streamed reports whether the change stream runs: enabled, and some keyspace is fed.
func (c *Config) Streamed() bool {
	if !c.Changes.Enabled {
		return false
	}
	for _, ks := range c.Keyspaces {
		if len(ks.FedBy) > 0 {
			return true
		}
	}
	return false
}

// StreamDSN is the DSN of the replication connection: [changes] dsn, else [postgres] dsn.
func (c *Config) StreamDSN() string {
	if c.Changes.DSN != "" {
		return c.Changes.DSN
	}
	return c.Postgres.DSN
}

// FeedingTables returns every fed_by table, "schema.table", once each, in file order.
func (c *Config) FeedingTables() []string {
	var out []string
	seen := map[string]bool{}
	for _, ks := range c.Keyspaces {
		for _, f := range ks.FedBy {
			if !seen[f.Table] {
				seen[f.Table] = true
				out = append(out, f.Table)
			}
		}
	}
	return out
}

// FeedColumns returns, for each fed_by table ("schema.table"), the id columns the keyspaces map its changes
// with: the only columns the stream keeps of its rows (stream.Config.Columns).
func (c *Config) FeedColumns() map[string][]string {
	out := map[string][]string{}
	for _, ks := range c.Keyspaces {
		for _, f := range ks.FedBy {
			if !slices.Contains(out[f.Table], f.ID) {
				out[f.Table] = append(out[f.Table], f.ID)
			}
		}
	}
	return out
}

// ChangeKeyspaces translates the fed keyspaces for warmer.NewChanges.
func (c *Config) ChangeKeyspaces() []warmer.ChangeKeyspace {
	var out []warmer.ChangeKeyspace
	for _, ks := range c.Keyspaces {
		if len(ks.FedBy) == 0 {
			continue
		}
		ck := warmer.ChangeKeyspace{Keyspace: ks.Name, OnChange: ks.OnChange}
		for _, f := range ks.FedBy {
			ck.Feeds = append(ck.Feeds, warmer.Feed{Table: f.Table, Column: f.ID})
		}
		out = append(out, ck)
	}
	return out
}

func decodeChanges(t *table, c *Changes) {
	c.Slot, c.Publication, c.CreatePublication = stream.DefaultSlot, stream.DefaultPublication, true
	c.VisibilityTimeout, c.Freshness = warmer.DefaultVisibilityTimeout, warmer.DefaultFreshness
	c.LeaseTTL, c.Gather = stream.DefaultLeaseTTL, stream.DefaultGather
	c.StatusInterval, c.MaxTxnChanges = stream.DefaultStatusInterval, stream.DefaultMaxTxnChanges
	t.boolean("enabled", &c.Enabled)
	t.str("dsn", &c.DSN)
	t.str("slot", &c.Slot)
	t.str("publication", &c.Publication)
	t.boolean("create_publication", &c.CreatePublication)
	if t.has("replay_timeout") {
		t.duration("replay_timeout", &c.VisibilityTimeout)
		if t.has("visibility_timeout") {
			t.problem("replay_timeout", "is the old name of visibility_timeout: set only visibility_timeout")
		} else {
			t.d.notes = append(t.d.notes, "changes: replay_timeout is now called visibility_timeout (it also bounds the wait for a synchronous standby); rename it")
		}
	}
	t.duration("visibility_timeout", &c.VisibilityTimeout)
	t.duration("freshness", &c.Freshness)
	t.duration("lease_ttl", &c.LeaseTTL)
	t.duration("gather", &c.Gather)
	t.duration("status_interval", &c.StatusInterval)
	t.integer("max_transaction_changes", &c.MaxTxnChanges)
	t.done()
	if t.d.known != nil {
		return
	}
	if !stream.ValidIdent(c.Slot) {
		t.problem("slot", "%q is not a valid slot name (lower-case letters, digits and _, at most 63)", c.Slot)
	}
	if !stream.ValidIdent(c.Publication) {
		t.problem("publication", "%q is not a valid publication name (lower-case letters, digits and _, at most 63)", c.Publication)
	}
	if c.DSN != "" {
		if err := pgsource.ParseDSN(c.DSN); err != nil {
			t.problem("dsn", "cannot parse: %v", err)
		}
	}
	if c.VisibilityTimeout <= 0 || c.VisibilityTimeout > time.Minute {
		t.problem("visibility_timeout", "%s is not in (0, 1m]", c.VisibilityTimeout)
	}
	if c.Freshness < 100*time.Millisecond || c.Freshness > time.Minute {
		t.problem("freshness", "%s is not in [100ms, 1m]", c.Freshness)
	}
	if c.LeaseTTL < time.Second || c.LeaseTTL > time.Minute {
		t.problem("lease_ttl", "%s is not in [1s, 1m]: a standby takes over within about lease_ttl", c.LeaseTTL)
	}
	if c.Gather < 0 || c.Gather > 5*time.Second {
		t.problem("gather", "%s is not in [0, 5s]", c.Gather)
	}
	if c.MaxTxnChanges < 1000 || c.MaxTxnChanges > 10_000_000 {
		t.problem("max_transaction_changes", "%d is not in [1000, 10000000]", c.MaxTxnChanges)
	}
	if c.StatusInterval < 100*time.Millisecond || c.StatusInterval > 30*time.Second {
		t.problem("status_interval", "%s is not in [100ms, 30s]: PostgreSQL's wal_sender_timeout (60 s by default) must be well above it", c.StatusInterval)
	}
}

// checkChanges checks [changes] against the keyspaces once both are decoded.
func checkChanges(t *table, c *Config) {
	if c.Changes.Enabled && len(c.FeedingTables()) == 0 {
		t.problem("enabled", "is true but no [[keyspace]] has fed_by")
	}
	if !c.Changes.Enabled && len(c.FeedingTables()) > 0 {
		c.notesAdd(t, "changes: some keyspaces have fed_by but [changes] enabled is false: no change stream runs")
	}
}

func (c *Config) notesAdd(t *table, n string) { t.d.notes = append(t.d.notes, n) }

// describeFeeds returns "track.album_id, album.album_id" for summaries.
func describeFeeds(fs []Feed) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, strings.TrimPrefix(f.Table, "public.")+"."+f.ID)
	}
	return strings.Join(parts, ", ")
}

// FeedsString returns the keyspace's fed_by as "track.album_id, album.album_id" ("-" for none).
func (ks *Keyspace) FeedsString() string {
	if len(ks.FedBy) == 0 {
		return "-"
	}
	return ks.OnChange + ": " + describeFeeds(ks.FedBy)
}
