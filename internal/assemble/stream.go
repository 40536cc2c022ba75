package assemble

import (
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
	"github.com/keepwarm/keepwarm/warmer"
)

// Txns converts the stream's transactions into the warmer's (the two packages do not import each other).
func Txns(in []stream.Txn) []warmer.Txn {
	out := make([]warmer.Txn, len(in))
	for i, t := range in {
		rows := make([]warmer.RowChange, len(t.Changes))
		for j, c := range t.Changes {
			rows[j] = warmer.RowChange{Table: c.Table, Old: c.Old, New: c.New}
		}
		out[i] = warmer.Txn{LSN: t.End, Xid: t.Xid, Commit: t.Commit, Changes: rows}
	}
	return out
}

// FeedColumns lists the config's fed_by entries for stream.CheckFeeds.
func FeedColumns(cfg *config.Config) []stream.FeedColumn {
	var out []stream.FeedColumn
	for _, ks := range cfg.Keyspaces {
		for _, f := range ks.FedBy {
			out = append(out, stream.FeedColumn{Keyspace: ks.Name, Table: f.Table, Column: f.ID})
		}
	}
	return out
}

// LeaseKey is the Redis key of the fleet's stream lease for a slot.
func LeaseKey(slot string) string { return "keepwarm:stream:" + slot }

// StreamConfig translates [changes] (and [postgres] connect_timeout) into the stream's config, without the
// parts a running daemon adds (Resync, Owed, Logger, Registerer): `run` starts the stream from it, and
// `validate --check-db` checks it (stream.Check), so that both look at the same slot, publication, tables
// and dsn.
func StreamConfig(cfg *config.Config) stream.Config {
	return stream.Config{
		DSN: cfg.StreamDSN(), Slot: cfg.Changes.Slot, Publication: cfg.Changes.Publication,
		Tables: cfg.FeedingTables(), CreatePublication: cfg.Changes.CreatePublication, Gather: cfg.Changes.Gather,
		StatusInterval: cfg.Changes.StatusInterval, Columns: cfg.FeedColumns(), MaxTxnChanges: cfg.Changes.MaxTxnChanges,
		ConnectTimeout: cfg.Postgres.ConnectTimeout,
	}
}
