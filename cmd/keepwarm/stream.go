package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/assemble"
	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/statuspage"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
	"github.com/keepwarm/keepwarm/warmer"
)

// healthStatus is what /debug/health returns and `keepwarm status` prints first: /readyz's verdict and the
// degradations.
type healthStatus struct {
	Ready    string        `json:"ready"` // "ready", or "not ready: ..."
	Degraded []degradation `json:"degraded,omitempty"`
}

// printHealth prints the daemon's health for `keepwarm status`.
func printHealth(w io.Writer, h healthStatus) {
	fmt.Fprintf(w, "health: %s\n", h.Ready)
	for _, g := range h.Degraded {
		fmt.Fprintf(w, "  degraded (%s): %s\n", g.Check, g.Detail)
	}
	fmt.Fprintln(w)
}

// streamStatus is what /debug/stream returns and `keepwarm status` prints.
type streamStatus struct {
	Enabled bool                `json:"enabled"`
	Lease   *stream.LeaseStatus `json:"lease,omitempty"`
	Stream  *stream.Status      `json:"stream,omitempty"`
}

// changeStream is the daemon's change-driven refresh: the stream lease, the replication stream, and the warmer's
// Changes that apply its transactions.
type changeStream struct {
	lease   *stream.Lease
	stream  *stream.Stream
	changes *warmer.Changes
}

// checkFeeds checks the fed_by tables and columns against the catalog and logs replica identity gaps; a no-op
// when [changes] is off.
func (d *daemon) checkFeeds(ctx context.Context) error { return d.checkFeedsOf(ctx, d.cfg) }

// checkFeedsOf is checkFeeds for cfg (a reload checks the new config's feeds before applying them).
func (d *daemon) checkFeedsOf(ctx context.Context, cfg *config.Config) error {
	if !cfg.Streamed() {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	warnings, err := stream.CheckFeeds(cctx, d.pool, assemble.FeedColumns(cfg))
	cancel()
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	for _, w := range warnings {
		d.log.Warn("changes: " + w.String())
	}
	return nil
}

// newChangeStream builds the change stream's parts for cfg, without I/O; nil when [changes] is off.
func newChangeStream(cfg *config.Config, w *warmer.Warmer, rdb redis.UniversalClient, reg prometheus.Registerer,
	log *slog.Logger) (*changeStream, error) {
	if !cfg.Streamed() {
		return nil, nil
	}
	changes, err := warmer.NewChanges(w, warmer.ChangesConfig{Keyspaces: cfg.ChangeKeyspaces(),
		VisibilityTimeout: cfg.Changes.VisibilityTimeout, Freshness: cfg.Changes.Freshness, Registerer: reg, Logger: log.With("component", "changes")})
	if err != nil {
		return nil, err
	}
	sc := assemble.StreamConfig(cfg)
	sc.Resync = changes.Resync
	sc.Owed = stream.NewOwedResyncs(rdb, assemble.LeaseKey(cfg.Changes.Slot)+":resync")
	sc.Logger, sc.Registerer = log.With("component", "stream"), reg
	st, err := stream.New(sc)
	if err != nil {
		return nil, err
	}
	lease, err := stream.NewLease(rdb, assemble.LeaseKey(cfg.Changes.Slot), cfg.Changes.LeaseTTL,
		log.With("component", "stream"), reg)
	if err != nil {
		return nil, err
	}
	return &changeStream{lease: lease, stream: st, changes: changes}, nil
}

// run streams while this daemon holds the lease, until ctx ends.
func (c *changeStream) run(ctx context.Context) error {
	return c.lease.Run(ctx, func(ctx context.Context) error {
		return c.stream.Run(ctx, func(ctx context.Context, txns []stream.Txn) error {
			return c.changes.Apply(ctx, assemble.Txns(txns))
		})
	})
}

func (c *changeStream) status() streamStatus {
	if c == nil {
		return streamStatus{}
	}
	l, s := c.lease.Status(), c.stream.Status()
	return streamStatus{Enabled: true, Lease: &l, Stream: &s}
}

func (c *changeStream) page() *statuspage.Stream {
	l, s := c.lease.Status(), c.stream.Status()
	return &statuspage.Stream{Role: l.State, State: s.State, Slot: s.Slot, Publication: s.Publication,
		AckedLSN: s.AckedLSN, LagBytes: s.LagBytes, LagSeconds: s.LagSeconds, Received: s.Received,
		Resyncs: s.Resyncs, LastCommit: s.LastCommit, LastError: s.LastError, Unpublished: s.Unpublished}
}

// printStream prints the change stream's state for `keepwarm status`.
func printStream(w io.Writer, st streamStatus) {
	if !st.Enabled || st.Lease == nil || st.Stream == nil {
		return
	}
	s := st.Stream
	fmt.Fprintf(w, "\nchange stream: %s (lease %s), slot %s, publication %s\n", s.State, st.Lease.State, s.Slot, s.Publication)
	last := "never"
	if !s.LastCommit.IsZero() {
		last = s.LastCommit.UTC().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(w, "  acknowledged %s, server %s, lag %d bytes / %.2fs, %d changes received, %d pending transactions, %d resyncs, last commit applied %s\n",
		s.AckedLSN, s.ServerLSN, s.LagBytes, s.LagSeconds, s.Received, s.Pending, s.Resyncs, last)
	if s.LastError != "" {
		fmt.Fprintf(w, "  last error: %s\n", s.LastError)
	}
	for _, p := range s.Problems {
		fmt.Fprintf(w, "  problem (%s): %s\n", p.Kind, p)
	}
}
