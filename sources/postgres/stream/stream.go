package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/keepwarm/keepwarm/sources/postgres"
	"github.com/keepwarm/keepwarm/sources/postgres/internal/pgdsn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/backoff"
)

// Defaults of a Config.
const (
	// ReleaseAfter is how long apply may fail in a row before the stream drops its replication connection and
	// reconnects with back-off. PostgreSQL's shutdown (even -m fast) waits until every logical walsender's client
	// has confirmed all WAL sent; a client that cannot apply (its origin queries are refused because the server is
	// shutting down) would otherwise hold the shutdown until wal_sender_timeout or forever. Unacknowledged changes
	// are sent again after the reconnect.
	ReleaseAfter = 3 * time.Second

	DefaultStatusInterval = 10 * time.Second // standby status updates when nothing else is sent
	DefaultMaxBatch       = 5000             // row changes handed to apply at once
	DefaultGather         = 20 * time.Millisecond
	// DefaultSlot and DefaultPublication are the names keepwarm gives its replication slot and publication.
	DefaultSlot        = "keepwarm"
	DefaultPublication = "keepwarm"
)

// DefaultMaxTxnChanges is Config.MaxTxnChanges's default.
const DefaultMaxTxnChanges = 100_000

// reconnectMax caps the stream's reconnect back-off. Every change committed while the stream is down is
// published late (the freshness SLO), so the stream comes back within 5 s of PostgreSQL; one replication
// connection attempt per 5 s, from one daemon of the fleet (the lease holder), costs the server nothing.
const reconnectMax = 5 * time.Second

// DefaultPublicationCheck is how often a streaming Stream re-reads its publication's tables and the feeding
// tables' OIDs (Config.PublicationCheck).
const DefaultPublicationCheck = 30 * time.Second

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidIdent reports whether s can be a slot or publication name: lower-case letters, digits and _, at most
// 63 bytes, not starting with a digit (a replication slot's own rules, applied to both).
func ValidIdent(s string) bool { return identRE.MatchString(s) }

// Config configures a Stream. Zero fields take the defaults noted on them.
type Config struct {
	// DSN of the primary (the stream needs one; a replica cannot serve a logical slot before PostgreSQL 16).
	// "replication=database" is added.
	DSN string
	// Slot is the permanent logical replication slot (plugin pgoutput) that keepwarm owns; default DefaultSlot.
	Slot string
	// Publication names the tables streamed; default DefaultPublication. It must exist (see EnsurePublication,
	// which `keepwarm migrate` and CreatePublication run, or the SQL in docs/operations.md).
	Publication string
	// Tables are the feeding tables, "schema.table". When CreatePublication is set, the stream creates the
	// publication or adds missing tables to it before streaming; otherwise it only checks them.
	Tables            []string
	CreatePublication bool
	// StatusInterval is how often a standby status update is sent when no acknowledgement is due; default
	// DefaultStatusInterval. PostgreSQL's wal_sender_timeout (60 s) must be longer.
	StatusInterval time.Duration
	// MaxBatch caps the row changes handed to apply in one call (whole transactions; a larger transaction goes
	// alone); default DefaultMaxBatch.
	MaxBatch int
	// Gather is how long the oldest received transaction waits for more before a batch is applied (default
	// DefaultGather; a negative value means no wait). Updates of one row within the window, and those that arrive
	// while the previous batch is applied, become one rebuild.
	Gather time.Duration
	// Resync, when set, is called after the slot was (re)created, and after a TRUNCATE of a feeding table,
	// before any later change is acknowledged: changes committed meanwhile were not seen, so the caller
	// refreshes what it holds. Until it returns nil, it is retried and nothing is acknowledged.
	Resync func(ctx context.Context, reason string) error
	// ConnectTimeout bounds each connection attempt; default DefaultPostgresConnectTimeout of the DSN (pgconn's).
	ConnectTimeout time.Duration
	// Columns, when set, are the only columns kept of each feeding table's rows ("schema.table" → column names):
	// the ones the caller maps changes with (fed_by's id columns). A row's other columns are dropped as it
	// arrives, so that a transaction's changes take a few bytes per row. Nil keeps every column.
	Columns map[string][]string
	// MaxTxnChanges caps the row changes kept of one transaction; default DefaultMaxTxnChanges, negative: no
	// cap. A larger transaction's changes are dropped as they arrive, and it is delivered with Overflowed set
	// and nothing else, after a resync (ResyncLargeTransaction) of every hot key: memory stays bounded
	// whatever one transaction changes (a 300,000-row UPDATE took 374–561 MiB before).
	MaxTxnChanges int
	// Owed, when set, keeps the resyncs owed outside the process, so that a kill -9 between a slot's creation
	// and the end of its resync does not lose the resync (the new slot starts after the changes it missed, and
	// nothing else would tell the next process). Without it a crash in that window leaves keys stale until
	// their TTL.
	Owed OwedStore
	// PublicationCheck is how often, while streaming, the publication's tables and the feeding tables' OIDs are
	// read again on a second, ordinary connection; default DefaultPublicationCheck, negative: only at each
	// session's start. A feeding table missing from the publication is added back (with CreatePublication;
	// else it is reported in Status.Unpublished) and a table whose OID changed is resynced: both
	// reconnect the stream, so that the next session adds it and resyncs before streaming on.
	PublicationCheck time.Duration
	// Logger defaults to slog.Default(); Registerer receives the stream's metrics (nil: none).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Status is a Stream's state, for `keepwarm status` and the status page.
type Status struct {
	State       string    `json:"state"` // "connecting", "streaming", "resync", "stopped"
	Slot        string    `json:"slot"`
	Publication string    `json:"publication"`
	AckedLSN    string    `json:"acked_lsn"`  // confirmed to PostgreSQL: everything before it is in Redis
	ServerLSN   string    `json:"server_lsn"` // the server's WAL end, last heard
	LagBytes    int64     `json:"lag_bytes"`
	LagSeconds  float64   `json:"lag_seconds"`
	Received    int64     `json:"changes_received"`
	Pending     int       `json:"transactions_pending"`
	LastCommit  time.Time `json:"last_commit,omitzero"` // commit time of the last transaction applied
	Resyncs     int64     `json:"resyncs"`
	// Unpublished lists the feeding tables ("schema.table") the publication lacked at the last check (the
	// problems of kind ProblemUnpublished): their changes do not arrive, so their keys follow their TTL only.
	Unpublished []string `json:"unpublished,omitempty"`
	// Problems lists every known gap between what the keyspaces need and what the stream receives: from the
	// catalog (each session's start and every PublicationCheck) and from the Relation messages the stream
	// decodes. Sorted by table, then kind.
	Problems  []Problem `json:"problems,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since,omitzero"` // when State last changed
	// AckedAt is when the acknowledged LSN last moved (or the session began): a stream whose server is ahead of
	// it and which has not moved for long is not advancing.
	AckedAt time.Time `json:"acked_at,omitzero"`
}

// Stream follows a publication through a permanent logical replication slot with the pgoutput plugin
// (jackc/pglogrepl) and hands each batch of committed transactions to an apply function; the slot is told that
// an LSN is processed only after apply returned nil for every transaction up to it, so delivery is at least once
// and survives crashes and reconnects: a restarted stream resumes at the slot's confirmed LSN. A lost or
// invalidated slot is recreated and Resync called. Build it with NewStream; Run streams until ctx ends.
//
// Unlike LISTEN/NOTIFY, no change is lost while keepwarm is disconnected (PostgreSQL keeps the WAL for the slot)
// and there is no payload limit.
type Stream struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	// mu guards the fields below it. The receive loop (stream), the applier (applyLoop, which owns the
	// transactions not yet applied and publishes their count here), the publication watch and Status share them.
	mu       sync.Mutex
	st       Status
	acked    pglogrepl.LSN // may be confirmed to the slot: every transaction up to it was applied
	server   pglogrepl.LSN
	pending  int       // transactions received and not yet applied (the applier's queue)
	oldest   time.Time // the commit time of the oldest of them
	appliedN int64     // transactions of this session applied
	failing  time.Time // when apply began failing in a row; zero while it succeeds
	ackedAt  time.Time // when acked last moved
	resync   []string
	oids     map[string]uint32 // feeding table → its OID at the session's start (0: not found)
	// tables and columns are the feeds in force (Config.Tables and Columns, qualified; Reconfigure
	// replaces them): every feeding table has an entry in columns.
	tables  []string
	columns map[string][]string
	// catalogProblems are the problems of the last catalog read (noteCatalog), relationProblems those of each
	// feeding table's last Relation message (noteRelation).
	catalogProblems  []Problem
	relationProblems map[string][]Problem
	parts            map[string]string // partition → its feeding table, from the last catalog read
	pubExists        bool              // the publication existed at the last catalog read
	// recreate: pgoutput could not find the publication at an LSN it has to decode (it was dropped and created
	// again): the slot cannot go past that LSN, so the next session drops it and creates it anew.
	recreate bool

	reconfig chan struct{} // Reconfigure asks the session to end (capacity 1)
	checkNow chan struct{} // a Relation of an unknown table asks the publication watch to look now (capacity 1)
}

// errReconfigured ends a session whose feeds were replaced by Reconfigure: the next one starts at once.
var errReconfigured = errors.New("feeding tables or columns changed")

// NewStream checks cfg and returns a Stream. It does not connect.
func New(cfg Config) (*Stream, error) {
	if cfg.Slot == "" {
		cfg.Slot = DefaultSlot
	}
	if cfg.Publication == "" {
		cfg.Publication = DefaultPublication
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.PublicationCheck == 0 {
		cfg.PublicationCheck = DefaultPublicationCheck
	}
	if cfg.MaxTxnChanges == 0 {
		cfg.MaxTxnChanges = DefaultMaxTxnChanges
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var errs []error
	if !ValidIdent(cfg.Slot) {
		errs = append(errs, fmt.Errorf("slot: %q is not a valid name (lower-case letters, digits, _; at most 63)", cfg.Slot))
	}
	if !ValidIdent(cfg.Publication) {
		errs = append(errs, fmt.Errorf("publication: %q is not a valid name (lower-case letters, digits, _; at most 63)", cfg.Publication))
	}
	for _, t := range cfg.Tables {
		if _, _, err := SplitTable(t); err != nil {
			errs = append(errs, err)
		}
	}
	if err := postgres.ParseDSN(cfg.DSN); err != nil {
		errs = append(errs, fmt.Errorf("dsn: %w", err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("postgres: stream: %w", errors.Join(errs...))
	}
	m := newMetrics()
	s := &Stream{cfg: cfg, log: cfg.Logger.With("slot", cfg.Slot), m: m, relationProblems: map[string][]Problem{},
		reconfig: make(chan struct{}, 1), checkNow: make(chan struct{}, 1)}
	s.tables, s.columns = qualifyFeeds(cfg.Tables, cfg.Columns)
	s.st = Status{State: "stopped", Slot: cfg.Slot, Publication: cfg.Publication, Since: time.Now()}
	m.register(cfg.Registerer, s)
	return s, nil
}

// qualifyFeeds returns tables and the keys of columns qualified ("track" → "public.track"). A table without an
// entry in columns keeps every column.
func qualifyFeeds(tables []string, columns map[string][]string) ([]string, map[string][]string) {
	qt := make([]string, 0, len(tables))
	for _, t := range tables {
		if q := QualifiedTable(t); !slices.Contains(qt, q) {
			qt = append(qt, q)
		}
	}
	qc := make(map[string][]string, len(columns))
	for t, cols := range columns {
		qc[QualifiedTable(t)] = slices.Clone(cols)
	}
	return qt, qc
}

// feeds returns copies of the feeding tables and their fed columns in force.
func (s *Stream) feeds() ([]string, map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cols := make(map[string][]string, len(s.columns))
	for t, c := range s.columns {
		cols[t] = slices.Clone(c)
	}
	return slices.Clone(s.tables), cols
}

// Reconfigure replaces the feeding tables ("schema.table") and their fed columns (a config reload that changed
// fed_by): the running session ends and the next one, started at once, adds new tables to the publication,
// decodes with the new columns, and resyncs (ResyncReconfigured) before streaming on, since changes acknowledged
// under the old feeds may matter to the new ones (a column renamed by a migration, say). Changes not yet
// acknowledged are sent again by PostgreSQL and decoded with the new columns. Unchanged feeds change nothing. The
// error names a table name that is not valid; nothing changes then.
func (s *Stream) Reconfigure(tables []string, columns map[string][]string) error {
	for _, t := range tables {
		if _, _, err := SplitTable(t); err != nil {
			return fmt.Errorf("postgres: stream: %w", err)
		}
	}
	qt, qc := qualifyFeeds(tables, columns)
	s.mu.Lock()
	same := slices.Equal(sortedCopy(qt), sortedCopy(s.tables)) && len(qc) == len(s.columns)
	for t, c := range qc {
		old, ok := s.columns[t]
		same = same && ok && slices.Equal(sortedCopy(c), sortedCopy(old))
	}
	if !same {
		s.tables, s.columns = qt, qc
	}
	s.mu.Unlock()
	if same {
		return nil
	}
	s.queueResync(ResyncReconfigured)
	s.log.Info("change stream: feeds changed; reconnecting with them and resyncing", "tables", qt)
	select {
	case s.reconfig <- struct{}{}:
	default:
	}
	return nil
}

func sortedCopy(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return out
}

// Status returns the stream's current state.
func (s *Stream) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.AckedLSN, st.ServerLSN = s.acked.String(), s.server.String()
	st.LagBytes, st.LagSeconds = s.lagLocked(time.Now())
	st.Pending = s.pending
	st.AckedAt = s.ackedAt
	st.Problems = s.problemsLocked()
	st.Unpublished = nil
	for _, p := range st.Problems {
		if p.Kind == ProblemUnpublished {
			st.Unpublished = append(st.Unpublished, p.Table)
		}
	}
	return st
}

// problemsLocked merges the catalog's problems with the Relation messages' (which are newer for the kinds they
// report), sorted by table and kind. Called with s.mu held.
func (s *Stream) problemsLocked() []Problem {
	var out []Problem
	fromRel := func(p Problem) bool {
		return (p.Kind == ProblemColumnMissing || p.Kind == ProblemReplicaIdentity) && s.relationProblems[p.Table] != nil
	}
	for _, p := range s.catalogProblems {
		if !fromRel(p) {
			out = append(out, p)
		}
	}
	for _, ps := range s.relationProblems {
		out = append(out, ps...)
	}
	slices.SortFunc(out, func(a, b Problem) int {
		if c := strings.Compare(a.Table, b.Table); c != 0 {
			return c
		}
		if c := strings.Compare(a.Kind, b.Kind); c != 0 {
			return c
		}
		return strings.Compare(a.Detail, b.Detail)
	})
	return slices.CompactFunc(out, func(a, b Problem) bool { return a == b })
}

// publishProblems sets the problem gauges from the problems known now.
func (s *Stream) publishProblems() {
	s.mu.Lock()
	ps := s.problemsLocked()
	s.mu.Unlock()
	counts := map[string]int{}
	for _, p := range ps {
		counts[p.Kind]++
	}
	for _, k := range problemKinds {
		s.m.problems.WithLabelValues(k).Set(float64(counts[k]))
	}
	s.m.unpublished.Set(float64(counts[ProblemUnpublished]))
}

// noteRelation checks a Relation message of a feeding table against its fed columns: a fed column missing from
// the columns sent (renamed or dropped, left out of a column list, generated), or outside a replica identity that
// is not FULL, is a problem until the next Relation message of the table says otherwise. A Relation of a table
// that is neither a feeding table nor a known partition of one asks the publication watch to look now: it may be
// a partition attached since.
func (s *Stream) noteRelation(rel Relation) {
	s.mu.Lock()
	cols, fed := s.columns[rel.Table], slices.Contains(s.tables, rel.Table)
	_, known := s.parts[rel.Sent]
	if !fed {
		s.mu.Unlock()
		if !known {
			select {
			case s.checkNow <- struct{}{}:
			default:
			}
		}
		return
	}
	var ps []Problem
	for _, c := range cols {
		i := slices.Index(rel.Columns, c)
		switch {
		case i < 0:
			ps = append(ps, Problem{Kind: ProblemColumnMissing, Table: rel.Table, Detail: fmt.Sprintf(
				"fed_by column %q is not among the columns the stream receives (%s): renamed or dropped, left out of the publication's column list, or generated; its changes cannot be mapped to ids",
				c, strings.Join(rel.Columns, ", "))})
		case rel.Identity != 'f' && !rel.Key[i]:
			ps = append(ps, identityProblem(rel.Table, c, identName(string(rel.Identity))))
		}
	}
	before := s.problemsLocked()
	if ps == nil {
		ps = []Problem{} // known to have none: hides the catalog's older view of these kinds
	}
	s.relationProblems[rel.Table] = ps
	after := s.problemsLocked()
	s.mu.Unlock()
	s.logProblemChanges(before, after)
	s.publishProblems()
}

func (s *Stream) lagLocked(now time.Time) (int64, float64) {
	var bytes int64
	if s.server > s.acked && s.acked > 0 {
		bytes = int64(s.server - s.acked)
	}
	secs := 0.0
	if s.pending > 0 {
		secs = max(now.Sub(s.oldest).Seconds(), 0)
	}
	return bytes, secs
}

func (s *Stream) setState(state string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.State != state {
		s.st.State, s.st.Since = state, time.Now()
	}
	if err != nil {
		s.st.LastError = err.Error()
	}
	s.m.streaming.Set(b2f(state == "streaming"))
}

// Run streams until ctx ends, reconnecting with back-off (1 s doubling to reconnectMax) after any failure. It calls
// apply with batches of whole transactions in commit order, never concurrently; a batch whose apply fails is
// offered again (with any transactions received since) after a back-off, so apply must be idempotent. Run
// returns nil when ctx ends; it returns an error only for a configuration PostgreSQL refuses for good (no
// publication and CreatePublication unset, wal_level not logical, a slot of another plugin). A catalog problem
// (a feeding table missing from the publication, a refused ALTER PUBLICATION) is retried or reported in Status,
// never fatal.
func (s *Stream) Run(ctx context.Context, apply func(ctx context.Context, txns []Txn) error) error {
	defer s.setState("stopped", nil)
	for attempt := 0; ; attempt++ {
		s.setState("connecting", nil)
		start := time.Now()
		s.mu.Lock()
		s.appliedN = 0 // a session that fails before it streams applied nothing
		s.mu.Unlock()
		err := s.session(ctx, apply)
		if ctx.Err() != nil {
			return nil
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			s.setState("stopped", err)
			return err
		}
		if errors.Is(err, errReconfigured) {
			attempt = -1
			continue
		}
		s.mu.Lock()
		applied := s.appliedN
		s.mu.Unlock()
		attempt = nextAttempt(attempt, time.Since(start), applied)
		pause := backoff.Delay(attempt, time.Second, reconnectMax, rand.Float64())
		s.setState("connecting", err)
		s.m.reconnects.Inc()
		s.log.Warn("change stream interrupted; reconnecting", "error", err, "retry_in", pause.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
	}
}

// nextAttempt returns the back-off attempt for the reconnect after a session that lasted lasted and applied
// applied transactions, attempt being the one before it. A session that streamed for a while (a minute), or that
// applied anything, proves the server and the slot work: its failure starts the back-off over (about 1 s), so
// that a new incident after an outage does not inherit the outage's back-off. Without the second rule, a
// session that began after a 25 s PostgreSQL outage and failed 19 s later (a synchronous standby stalled past
// visibility_timeout) released the slot for 20 s more, every change meanwhile late (soak seed 1).
func nextAttempt(attempt int, lasted time.Duration, applied int64) int {
	if lasted > time.Minute || applied > 0 {
		return 0
	}
	return attempt
}

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// replicationDSN adds replication=database to dsn.
func replicationDSN(dsn string) string {
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "replication=database"
	}
	return dsn + " replication=database"
}

// pgxOnlyParams are DSN settings that pgx and pgxpool read and remove before connecting ([postgres] dsn often
// carries default_query_exec_mode=exec for PgBouncer). pgconn alone would send them to the server as run-time
// parameters, which PostgreSQL refuses ("unrecognized configuration parameter") and PgBouncer too ("unsupported
// startup parameter").
var pgxOnlyParams = []string{"default_query_exec_mode", "statement_cache_capacity", "description_cache_capacity",
	"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime", "pool_max_conn_idle_time",
	"pool_health_check_period", "pool_max_conn_lifetime_jitter"}

// connConfig parses dsn for a pgconn connection (the stream's own connections), without pgx's settings.
func connConfig(dsn string, connectTimeout time.Duration) (*pgconn.Config, error) {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	for _, k := range pgxOnlyParams {
		delete(pc.RuntimeParams, k)
	}
	if connectTimeout > 0 {
		pc.ConnectTimeout = connectTimeout
	}
	return pc, nil
}

func (s *Stream) connect(ctx context.Context) (*pgconn.PgConn, error) {
	pc, err := connConfig(replicationDSN(s.cfg.DSN), s.cfg.ConnectTimeout)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", pgdsn.Scrub(err))
	}
	if s.cfg.ConnectTimeout > 0 {
		pc.ConnectTimeout = s.cfg.ConnectTimeout
	}
	if _, ok := pc.RuntimeParams["application_name"]; !ok {
		pc.RuntimeParams["application_name"] = "keepwarm-stream"
	}
	return pgconn.ConnectConfig(ctx, pc)
}

// session is one connection's life: check the publication and slot, resync if needed, stream.
func (s *Stream) session(ctx context.Context, apply func(context.Context, []Txn) error) error {
	conn, err := s.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := checkServer(ctx, conn); err != nil {
		return err
	}
	if err := s.loadOwed(ctx); err != nil {
		return err
	}
	repaired, err := s.ensurePublication(ctx, conn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	exists := s.pubExists
	s.mu.Unlock()
	if !exists {
		return fmt.Errorf("publication %q does not exist and [changes] create_publication is false: run `keepwarm migrate up`",
			s.cfg.Publication)
	}
	if repaired {
		s.queueResync(ResyncPublication)
	}
	if err := s.ensureSlot(ctx, conn); err != nil {
		return err
	}
	tables, columns := s.feeds()
	oids, err := tableOIDs(ctx, conn, tables)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.oids = oids
	parts := maps.Clone(s.parts)
	s.mu.Unlock()
	if err := s.runResyncs(ctx); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.cfg.Publication + "'"},
	})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	if h := s.slotHistory(); h != nil {
		if err := h.MarkStreamed(ctx); err != nil {
			return fmt.Errorf("record that the slot is streamed from: %w", err)
		}
	}
	s.setState("streaming", nil)
	s.mu.Lock()
	s.st.LastError = ""
	s.mu.Unlock()
	s.log.Info("change stream started", "publication", s.cfg.Publication, "from_lsn", s.Status().AckedLSN)
	dec := newDecoder(columns, s.cfg.MaxTxnChanges)
	dec.rename, dec.onRelation = parts, s.noteRelation
	return s.stream(ctx, conn, dec, apply)
}

// checkServer checks that the server's wal_level is logical (a *fatalError if not).
func checkServer(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, "select current_setting('wal_level'), pg_is_in_recovery()::text").ReadAll()
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return errors.New("read wal_level: no row")
	}
	row := res[0].Rows[0]
	if string(row[0]) != "logical" {
		return &fatalError{fmt.Errorf("postgres: wal_level is %q; the change stream needs wal_level = logical (docs/operations.md)", row[0])}
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal. Only names checked by ValidIdent or SplitTable reach it.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// CheckStream checks, over one ordinary connection to cfg.DSN and without changing anything, what Run would
// refuse or report for cfg: wal_level not logical; the publication missing, or lacking feeding tables, when
// CreatePublication is off (Run stops, or streams without those tables and reports them); and a slot of that
// name with another plugin than pgoutput. `keepwarm validate --check-db` runs it. The error joins one error
// per problem, each naming the setting to change; a connection failure is returned alone.
func Check(ctx context.Context, cfg Config) error {
	pc, err := connConfig(cfg.DSN, cfg.ConnectTimeout)
	if err != nil {
		return fmt.Errorf("postgres: change stream: parse dsn: %w", pgdsn.Scrub(err))
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("postgres: change stream: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var errs []error
	// The stream's own connection is a replication connection, which a pooler such as PgBouncer (before 1.23)
	// does not pass on.
	if rc, err := connConfig(replicationDSN(cfg.DSN), cfg.ConnectTimeout); err == nil {
		repl, err := pgconn.ConnectConfig(ctx, rc)
		if err == nil {
			_, err = pglogrepl.IdentifySystem(ctx, repl)
			repl.Close(context.WithoutCancel(ctx))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("postgres: change stream: a replication connection (replication=database) fails: %w; "+
				"behind a connection pooler such as PgBouncer, point [changes] dsn (KEEPWARM_CHANGES_DSN) at PostgreSQL itself", err))
		}
	}
	var fe *fatalError
	if err := checkServer(ctx, conn); errors.As(err, &fe) {
		errs = append(errs, fe.err)
	} else if err != nil {
		return err
	}
	tables, columns := qualifyFeeds(cfg.Tables, cfg.Columns)
	st, err := readPublication(ctx, conn, cfg.Publication, tables)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	switch {
	case !st.exists && !cfg.CreatePublication:
		errs = append(errs, fmt.Errorf("postgres: publication %q does not exist and [changes] create_publication is false: run `keepwarm migrate up` or %s",
			cfg.Publication, PublicationSQL(cfg.Publication, tables)))
	case st.exists:
		for _, p := range st.problems(cfg.Publication, tables, columns, nil) {
			// With create_publication the daemon adds missing tables and actions and publishes stored generated
			// columns; a replica identity gap is a warning (CheckFeeds), not an error.
			repairable := p.Kind == ProblemUnpublished || p.Kind == ProblemActions ||
				(p.Kind == ProblemGenerated && st.version >= 180000 && st.tables[p.Table] != nil && !strings.Contains(p.Detail, "virtual"))
			if p.Kind == ProblemReplicaIdentity || (cfg.CreatePublication && repairable) {
				continue
			}
			if p.Kind == ProblemUnpublished || p.Kind == ProblemActions {
				p.Detail += "; [changes] create_publication is false, so keepwarm does not repair it"
			}
			errs = append(errs, fmt.Errorf("postgres: change stream: %s", p))
		}
	}
	res, err := conn.Exec(ctx, "select plugin from pg_replication_slots where slot_name = "+quoteLiteral(cfg.Slot)).ReadAll()
	if err != nil {
		return fmt.Errorf("postgres: read slot: %w", err)
	}
	if len(res) > 0 && len(res[0].Rows) > 0 {
		if plugin := string(res[0].Rows[0][0]); plugin != "pgoutput" {
			errs = append(errs, slotPluginError(cfg.Slot, plugin))
		}
	}
	return errors.Join(errs...)
}

// stream receives messages, decodes them (decoder) and hands each committed transaction to the applier
// (applyLoop) over a channel, until the connection fails or ctx ends. All I/O on conn happens in this goroutine;
// the applier only moves the acknowledged LSN, which the next status update sends. The applier is always ready
// for the next transaction (it applies on a goroutine of its own), so this loop never waits on apply and keeps
// answering the server's keepalives however long apply takes.
func (s *Stream) stream(ctx context.Context, conn *pgconn.PgConn, dec *decoder, apply func(context.Context, []Txn) error) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.pending, s.oldest, s.appliedN = 0, time.Time{}, 0 // the server sends again everything after the acknowledged LSN
	s.failing, s.ackedAt = time.Time{}, time.Now()
	s.mu.Unlock()
	txns := make(chan Txn) // received, in commit order; the applier owns them from here
	applied := make(chan error, 1)
	var applier sync.WaitGroup
	applier.Add(1)
	go func() {
		defer applier.Done()
		applied <- s.applyLoop(sctx, txns, apply)
	}()
	defer func() {
		cancel() // before the wait: the applier stops when sctx ends
		applier.Wait()
	}()
	watched := make(chan error, 1)
	if s.cfg.PublicationCheck > 0 {
		applier.Add(1)
		go func() {
			defer applier.Done()
			t := time.NewTicker(s.cfg.PublicationCheck)
			defer t.Stop()
			var last time.Time
			for {
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				case <-s.checkNow:
					// A table the stream did not know sent its first change: a partition attached since, maybe.
					// At most one such look a second.
					if time.Since(last) < time.Second {
						continue
					}
				}
				last = time.Now()
				if err := s.checkPublication(sctx); err != nil {
					watched <- err
					return
				}
			}
		}()
	}

	var sentAck pglogrepl.LSN
	lastStatus := time.Time{}
	// A keepalive's WAL end, received outside a transaction when delivered transactions numbered delivered, may
	// be acknowledged once those are applied: nothing before it is unprocessed.
	var idleEnd pglogrepl.LSN
	var idleAt, delivered int64
	for {
		select {
		case err := <-applied:
			return err
		case err := <-watched:
			return err
		case <-s.reconfig:
			return errReconfigured
		default:
		}
		s.mu.Lock()
		if !s.failing.IsZero() && time.Since(s.failing) > ReleaseAfter {
			s.mu.Unlock()
			return fmt.Errorf("applying changes has failed for %v; releasing the slot until it can (changes are sent again)", ReleaseAfter)
		}
		// Every transaction handed over is applied (appliedN counts this session's, like delivered), and none is
		// being received: the keepalive's position holds nothing unprocessed.
		if idleEnd > s.acked && s.appliedN >= idleAt && s.appliedN == delivered && !dec.inTxn() {
			s.acked, s.ackedAt = idleEnd, time.Now()
		}
		ack := s.acked
		s.mu.Unlock()
		if ack != sentAck || time.Since(lastStatus) >= s.cfg.StatusInterval {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: ack}); err != nil {
				return fmt.Errorf("send status: %w", err)
			}
			sentAck, lastStatus = ack, time.Now()
		}
		rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		raw, err := conn.ReceiveMessage(rctx)
		rcancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		var data []byte
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			pe := pgconn.ErrorResponseToPgError(m)
			if pe.Code == "42704" && strings.Contains(pe.Message, "publication") {
				// pgoutput looks the publication up as of the LSN it decodes: one dropped and created again
				// (by an operator or a migration tool) does not exist there, and never will. Only a new slot
				// starts past it; what was committed meanwhile is resynced.
				s.mu.Lock()
				s.recreate = true
				s.mu.Unlock()
				s.log.Error("the publication was dropped and created again under the slot: recreating the slot and resyncing",
					"publication", s.cfg.Publication, "error", pe)
			}
			return fmt.Errorf("server: %w", pe)
		case *pgproto3.CopyData:
			data = m.Data
		default:
			continue
		}
		if len(data) == 0 {
			return errors.New("receive: empty CopyData message")
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			s.noteServer(pkm.ServerWALEnd)
			if !dec.inTxn() {
				idleEnd, idleAt = pkm.ServerWALEnd, delivered
			}
			if pkm.ReplyRequested {
				lastStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("parse xlog data: %w", err)
			}
			s.noteServer(xld.ServerWALEnd)
			txn, overflowed, err := dec.decode(xld.WALData)
			if err != nil {
				return fmt.Errorf("parse pgoutput: %w", err)
			}
			if overflowed {
				s.m.overflowed.Inc()
				s.log.Warn("a transaction changes more rows than max_transaction_changes: dropping its changes and refreshing every hot key instead",
					"max_transaction_changes", s.cfg.MaxTxnChanges)
			}
			if txn == nil {
				continue
			}
			if txn.OldUnknown > 0 {
				s.m.oldUnknown.Add(float64(txn.OldUnknown))
			}
			txn.received = time.Now()
			s.m.received.Add(float64(txn.rows))
			s.m.txns.Inc()
			s.mu.Lock()
			s.st.Received += int64(txn.rows)
			s.mu.Unlock()
			select {
			case txns <- *txn:
				delivered++
			case err := <-applied:
				return err
			case <-ctx.Done():
				return fmt.Errorf("receive: %w", ctx.Err())
			}
		}
	}
}

func (s *Stream) noteServer(end pglogrepl.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.server = max(s.server, end)
}

// applyLoop owns the transactions received and not yet applied. It takes them from txns in commit order, and
// hands them to apply in batches of whole transactions (at most MaxBatch changes, unless one transaction alone
// has more), each after its oldest transaction waited Gather for company, one batch at a time on a goroutine of
// its own: it is always ready for the next transaction, and those that arrive while a batch is applied join the
// next one. Resyncs a batch needs (truncates, overflowed transactions) run before its apply.
//
// When apply returned nil, the acknowledged LSN moves to the End of the batch's last transaction, and never
// before: an LSN is confirmed only once every transaction up to it was applied. When apply (or a resync)
// fails, nothing is acknowledged and the batch, with whatever arrived since, is offered again after a back-off
// (100 ms doubling to 5 s). It returns nil when ctx ends, after any apply in progress has returned.
func (s *Stream) applyLoop(ctx context.Context, txns <-chan Txn, apply func(context.Context, []Txn) error) error {
	var pending []Txn
	publish := func() { // under s.mu: what Status and the lag gauges show
		s.pending, s.oldest = len(pending), time.Time{}
		if len(pending) > 0 {
			s.oldest = pending[0].Commit
		}
	}
	done := make(chan error, 1) // the batch in progress's result
	busy, n := false, 0         // a batch of pending's first n is being applied
	failures := 0
	var retryAt time.Time // after a failure: when the batch is offered again
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var wake <-chan time.Time
		if !busy && len(pending) > 0 {
			wait := time.Until(retryAt)
			if failures == 0 {
				wait = s.cfg.Gather - time.Since(pending[0].received)
			}
			if wait > 0 {
				timer.Reset(wait)
				wake = timer.C
			} else {
				n = batchLen(pending, s.cfg.MaxBatch)
				busy = true
				go func(batch []Txn) { done <- s.applyBatch(ctx, batch, apply) }(slices.Clone(pending[:n]))
			}
		}
		select {
		case <-ctx.Done():
			if busy {
				<-done
			}
			return nil
		case t := <-txns:
			pending = append(pending, t)
			s.mu.Lock()
			publish()
			s.mu.Unlock()
		case <-wake:
		case err := <-done:
			busy = false
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				pause := backoff.Delay(failures, 100*time.Millisecond, 5*time.Second, rand.Float64())
				failures++
				if failures == 1 || failures%20 == 0 {
					s.log.Warn("applying changes failed; retrying (not acknowledged, nothing lost)", "error", err,
						"transactions", n, "attempt", failures, "retry_in", pause.String())
				}
				s.mu.Lock()
				s.st.LastError = err.Error()
				if s.failing.IsZero() {
					s.failing = time.Now()
				}
				s.mu.Unlock()
				s.m.applyErrors.Inc()
				retryAt = time.Now().Add(pause)
				continue
			}
			failures = 0
			last := pending[n-1]
			pending = pending[n:]
			s.mu.Lock()
			s.failing = time.Time{}
			if pglogrepl.LSN(last.End) > s.acked {
				s.acked, s.ackedAt = pglogrepl.LSN(last.End), time.Now()
			}
			s.appliedN += int64(n)
			s.st.LastCommit = last.Commit
			publish()
			s.mu.Unlock()
		}
	}
}

// batchLen returns how many of pending's first transactions make the next batch: whole transactions while their
// changes total at most maxBatch, and at least one.
func batchLen(pending []Txn, maxBatch int) int {
	n, changes := 0, 0
	for n < len(pending) && (n == 0 || changes+len(pending[n].Changes) <= maxBatch) {
		changes += len(pending[n].Changes)
		n++
	}
	return n
}

// applyBatch runs the resyncs batch needs (a truncate of a feeding table, a transaction past MaxTxnChanges),
// then apply.
func (s *Stream) applyBatch(ctx context.Context, batch []Txn, apply func(context.Context, []Txn) error) error {
	for _, t := range batch {
		if len(t.Truncated) > 0 {
			s.queueResync(ResyncTruncate)
		}
		if t.Overflowed {
			s.queueResync(ResyncLargeTransaction)
		}
	}
	if err := s.runResyncs(ctx); err != nil {
		return err
	}
	return apply(ctx, batch)
}
