package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keepwarm/keepwarm/lockstep"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
	"github.com/keepwarm/keepwarm/warmer"
)

// Keyspace is one [[keyspace]]: one kind of key, its templates, TTLs and how to rebuild it. Its keys are listed
// once, in KeyspaceFields, which decodes, prints and summarizes them.
type Keyspace struct {
	// KeyspaceConfig holds every key the warmer uses, decoded straight into it: after Load it is the effective
	// config, with warmer's Resolve defaults in (validate shows it and run uses it). Its defaults and bounds are
	// warmer's. Src, StatementTimeout, PoolWaitTimeout and Pinned are not [[keyspace]] keys: WarmerKeyspace
	// sets them from the source, [postgres] and [[hotkeys]].
	warmer.KeyspaceConfig

	Key   string // cache key template, e.g. "track:${id}"; parsed into KeyspaceConfig.Keys
	Lock  string // lock key template; default lockstep.DefaultLockTemplate
	Stale string // stale copy template; "" means no stale copy
	Meta  string // metadata hash template; default lockstep.DefaultMetaTemplate

	Query    string // SQL taking $1 (text[] of ids), returning rows (id, value). Required.
	IDsQuery string // SQL listing ids for warmups; optional

	// OnChange is what a change to a feeding row does: warmer.OnChangeRefresh (default) or
	// warmer.OnChangeInvalidate. FedBy lists the feeding tables and id columns (see [changes]).
	OnChange string
	FedBy    []Feed
}

// Keys returns the keyspace's parsed key templates.
func (ks *Keyspace) Keys() *lockstep.Keys { return ks.KeyspaceConfig.Keys }

// KeyspaceField is one key of a [[keyspace]] table. KeyspaceFields lists them all: the one place where a key is
// named, typed, defaulted, bounded, documented and tied to its struct field. The decoder, Redacted's printout
// and `keepwarm validate`'s summary all walk that list.
type KeyspaceField struct {
	Key  string // the TOML key
	Type string // how the file writes it: string, duration, integer, number, boolean, ...
	// Default is the default in words: the constant that holds it, or the rule that derives it. A default whose
	// zero means "the default" is warmer's Resolve's; Load applies only those a zero cannot mean (unset).
	Default string
	Bound   string // the accepted values in words; checked by warmer's Resolve, or by decodeKeyspace when it involves other keys
	Doc     string
	Column  string // the header of validate's summary column, or "" when the summary leaves it out

	field func(ks *Keyspace) any            // a pointer to the struct field the key decodes into
	unset func(ks *Keyspace)                // what Load does when the key is not set; nil: the zero value, for Resolve
	omit  func(ks *Keyspace) bool           // leave the key out of the printout
	value func(ks *Keyspace) any            // the printed value, when it is not *field
	cell  func(ks *Keyspace) string         // the summary's cell, when it is not the printed value
	parse func(t *table, ks *Keyspace) bool // the decoder, when it is not the one field's type's
}

// KeyspaceFields returns the keys of a [[keyspace]], in the order Redacted prints them.
func KeyspaceFields() []KeyspaceField { return slices.Clone(keyspaceFields) }

var keyspaceFields = []KeyspaceField{
	{Key: "name", Type: "string", Default: "none: required", Column: "KEYSPACE",
		Bound: "unique; letters, digits, '_', '-' and '.', up to 64, starting with a letter or digit",
		Doc:   "used in logs and as a metric label",
		field: func(ks *Keyspace) any { return &ks.Name }},
	{Key: "key", Type: "template", Default: "none: required", Column: "KEY",
		Bound: "has ${id} or ${key}; unique among keyspaces", Doc: `cache key template, e.g. "track:${id}"`,
		field: func(ks *Keyspace) any { return &ks.Key }},
	{Key: "lock", Type: "template", Default: "lockstep.DefaultLockTemplate", Doc: "lock key template, shared with apps",
		field: func(ks *Keyspace) any { return &ks.Lock }},
	{Key: "stale", Type: "template", Default: "none: no stale copy", Doc: "stale copy template, served while a rebuild is in flight",
		field: func(ks *Keyspace) any { return &ks.Stale },
		omit:  func(ks *Keyspace) bool { return ks.Stale == "" }},
	{Key: "meta", Type: "template", Default: "lockstep.DefaultMetaTemplate", Doc: "metadata hash template",
		field: func(ks *Keyspace) any { return &ks.Meta }},
	{Key: "keep_meta", Type: "boolean", Default: "false", Doc: "write the meta hash beside each value (warmer.KeyspaceConfig.KeepMeta)",
		field: func(ks *Keyspace) any { return &ks.KeepMeta }},
	{Key: "ttl", Type: "duration", Default: "none: required", Bound: "(0, warmer.MaxDuration]", Column: "TTL",
		Doc:   "TTL written with each value, before jitter",
		field: func(ks *Keyspace) any { return &ks.TTL }},
	{Key: "jitter", Type: "number", Default: "lockstep.DefaultJitter, as apps' lockstep clients", Bound: "[0, 1]", Column: "JITTER",
		Doc:   "written TTLs spread over [ttl, ttl×(1+jitter))",
		field: func(ks *Keyspace) any { return &ks.Jitter },
		unset: func(ks *Keyspace) { ks.Jitter = lockstep.DefaultJitter }}, // a zero Jitter is none
	{Key: "refresh_ahead", Type: "fraction or duration", Default: "warmer.DefaultRefreshAheadFraction of ttl",
		Bound: "a fraction in (0, 1) (0.2, \"20%\") or a duration; at most half the ttl", Column: "REFRESH AHEAD",
		Doc:   "how long before expiry a hot key is rebuilt",
		field: func(ks *Keyspace) any { return &ks.RefreshAhead },
		parse: parseRefreshAhead,
		value: refreshAheadString,
		cell: func(ks *Keyspace) string {
			if ks.RefreshAheadFraction > 0 {
				return refreshAheadString(ks).(string) + " (" + ks.RefreshAhead.String() + ")"
			}
			return ks.RefreshAhead.String()
		}},
	{Key: "lock_ttl", Type: "duration", Default: "max(warmer.DefaultMinLockTTL, 2 × [postgres] statement_timeout)",
		Bound: "above [postgres] statement_timeout", Column: "LOCK TTL",
		Doc:   "apps' rebuild lock TTL; the daemon's own leases are shorter",
		field: func(ks *Keyspace) any { return &ks.LockTTL }},
	{Key: "stale_ttl", Type: "duration", Default: "warmer.DefaultStaleTTLFactor × ttl, with a stale template",
		Bound: "above ttl; only with stale", Column: "STALE TTL", Doc: "TTL of the stale copy",
		field: func(ks *Keyspace) any { return &ks.StaleTTL },
		omit:  func(ks *Keyspace) bool { return ks.Stale == "" }},
	{Key: "max_stale", Type: "duration", Default: "warmer.DefaultMaxStale", Bound: "(0, warmer.MaxDuration]",
		Doc:   "fail-safe: how long a value may be kept past its TTL while the origin fails",
		field: func(ks *Keyspace) any { return &ks.MaxStale }},
	{Key: "query", Type: "string", Default: "none: required", Bound: "uses $1",
		Doc:   "SQL taking $1 (a text[] of ids) and returning rows (id, value)",
		field: func(ks *Keyspace) any { return &ks.Query }},
	{Key: "ids_query", Type: "string", Default: "none: no warmup by ids_query", Bound: "takes no parameters",
		Doc:   "SQL listing ids, for warmups",
		field: func(ks *Keyspace) any { return &ks.IDsQuery },
		omit:  func(ks *Keyspace) bool { return ks.IDsQuery == "" }},
	{Key: "missing", Type: "string", Default: "warmer.MissingDelete", Bound: "delete, keep or tombstone",
		Doc:   "what a refresh does with an id the origin no longer has",
		field: func(ks *Keyspace) any { return &ks.Missing }},
	{Key: "tombstone_value", Type: "string", Default: "none: required with missing = \"tombstone\"",
		Bound: "only with missing = \"tombstone\"", Doc: "the bytes written for a missing id",
		field: func(ks *Keyspace) any { return &ks.Tombstone },
		omit:  func(ks *Keyspace) bool { return ks.Missing != warmer.MissingTombstone }},
	{Key: "tombstone_ttl", Type: "duration", Default: "ttl", Bound: "only with missing = \"tombstone\"",
		Doc:   "TTL of a tombstone",
		field: func(ks *Keyspace) any { return &ks.TombstoneTTL },
		// warmer requires TombstoneTTL with MissingTombstone (it has no default there).
		unset: func(ks *Keyspace) {
			if ks.Missing == warmer.MissingTombstone {
				ks.TombstoneTTL = ks.TTL
			}
		},
		omit: func(ks *Keyspace) bool { return ks.Missing != warmer.MissingTombstone }},
	{Key: "batch_size", Type: "integer", Default: "warmer.DefaultBatchSize", Bound: "[1, warmer.MaxBatchSize]",
		Doc:   "ids per origin query and per pipeline",
		field: func(ks *Keyspace) any { return &ks.BatchSize }},
	{Key: "max_origin_concurrency", Type: "integer", Default: "warmer.DefaultMaxOriginConcurrency", Bound: "at least 1",
		Doc:   "batches querying the origin at once",
		field: func(ks *Keyspace) any { return &ks.MaxOriginConcurrency }},
	{Key: "origin_rate", Type: "number", Default: "0: unlimited", Bound: "at least 0",
		Doc:   "origin queries per second",
		field: func(ks *Keyspace) any { return &ks.OriginRate }},
	{Key: "top_n", Type: "integer", Default: "warmer.DefaultTopN", Bound: "[0, warmer.MaxTopN]; 0: pinned and scheduled keys only",
		Column: "TOP N", Doc: "the hot set: this many best-scored ids, plus the pinned ones",
		field: func(ks *Keyspace) any { return &ks.TopN },
		unset: func(ks *Keyspace) { ks.TopN = warmer.DefaultTopN }}, // a zero TopN is pinned only
	{Key: "min_score", Type: "number", Default: "warmer.DefaultMinScore", Bound: "at least 0; 0: no floor",
		Doc:   "the least decayed access score of a hot id",
		field: func(ks *Keyspace) any { return &ks.MinScore },
		unset: func(ks *Keyspace) { ks.MinScore = warmer.DefaultMinScore }}, // a zero MinScore is no floor
	{Key: "max_value_bytes", Type: "integer", Default: "warmer.DefaultMaxValueBytes",
		Bound: "[0, warmer.MaxValueBytesLimit]; 0: no limit", Doc: "larger values are not written",
		field: func(ks *Keyspace) any { return &ks.MaxValueBytes },
		unset: func(ks *Keyspace) { ks.MaxValueBytes = warmer.DefaultMaxValueBytes }}, // a zero MaxValueBytes is no limit
	{Key: "max_tracked", Type: "integer",
		Default: "max(warmer.DefaultMaxTrackedFactor × top_n, warmer.DefaultMaxTracked), raised to fit the pinned ids",
		Bound:   "at least top_n and 1, at most warmer.MaxTrackedLimit", Column: "MAX TRACKED", Doc: "ids tracked for scoring (coldest leave first)",
		field: func(ks *Keyspace) any { return &ks.MaxTracked }},
	{Key: "decay_half_life", Type: "duration", Default: "warmer.DefaultDecayHalfLife", Bound: "(0, warmer.MaxDuration]", Column: "DECAY",
		Doc:   "access scores halve every decay_half_life",
		field: func(ks *Keyspace) any { return &ks.DecayHalfLife }},
	{Key: "history_half_life", Type: "duration", Default: "warmer.DefaultHistoryFactor × decay_half_life, at least 1s, at most warmer.MaxDuration",
		Bound: "[max(decay_half_life, 1s), warmer.MaxDuration]", Column: "HISTORY",
		Doc:   "the selection's long memory of reads (a frequency sketch) halves every history_half_life",
		field: func(ks *Keyspace) any { return &ks.HistoryHalfLife }},
	{Key: "lfu", Type: "boolean", Default: "false", Doc: "also read Redis's OBJECT FREQ (needs an LFU maxmemory-policy)",
		field: func(ks *Keyspace) any { return &ks.LFU }},
	{Key: "on_change", Type: "string", Default: "warmer.OnChangeRefresh, with fed_by", Bound: "refresh or invalidate; only with fed_by",
		Doc:   "what a change to a feeding row does",
		field: func(ks *Keyspace) any { return &ks.OnChange },
		omit:  func(ks *Keyspace) bool { return len(ks.FedBy) == 0 }},
	{Key: "fed_by", Type: "array of { table, id }", Default: "none: not change-driven",
		Bound: "tables and plain lower-case id columns, each pair once", Doc: "the tables whose changed rows refresh this keyspace",
		field: func(ks *Keyspace) any { return &ks.FedBy },
		parse: parseFedBy,
		value: func(ks *Keyspace) any {
			var feeds []string
			for _, f := range ks.FedBy {
				feeds = append(feeds, fmt.Sprintf("{ table = %s, id = %s }", tomlValue(f.Table), tomlValue(f.ID)))
			}
			return rawTOML("[" + strings.Join(feeds, ", ") + "]")
		},
		omit: func(ks *Keyspace) bool { return len(ks.FedBy) == 0 }},
	{Key: "reconcile_budget", Type: "integer", Default: "warmer.DefaultReconcileBudget", Bound: "at least 1",
		Doc:   "PTTL commands per second that reconciliation may send",
		field: func(ks *Keyspace) any { return &ks.ReconcileBudget }},
}

// rawTOML is a value Redacted prints as it is.
type rawTOML string

// decode reads the field's key into ks with the decoder of its type, and reports whether it was set (and valid).
func (f *KeyspaceField) decode(t *table, ks *Keyspace) bool {
	if f.parse != nil {
		return f.parse(t, ks)
	}
	switch p := f.field(ks).(type) {
	case *string:
		return t.str(f.Key, p)
	case *[]byte:
		var s string
		if !t.str(f.Key, &s) {
			return false
		}
		*p = []byte(s)
		return true
	case *time.Duration:
		return t.duration(f.Key, p)
	case *int:
		return t.integer(f.Key, p)
	case *float64:
		return t.float(f.Key, p)
	case *bool:
		return t.boolean(f.Key, p)
	}
	panic(fmt.Sprintf("config: keyspace field %q: no decoder for %T", f.Key, f.field(ks)))
}

// Value returns the field's effective value in ks, as Redacted prints it.
func (f *KeyspaceField) Value(ks *Keyspace) any {
	if f.value != nil {
		return f.value(ks)
	}
	switch p := f.field(ks).(type) {
	case *string:
		return *p
	case *[]byte:
		return string(*p)
	case *time.Duration:
		return *p
	case *int:
		return *p
	case *float64:
		return *p
	case *bool:
		return *p
	}
	panic(fmt.Sprintf("config: keyspace field %q: no value for %T", f.Key, f.field(ks)))
}

// Cell returns the field's effective value in ks as validate's summary shows it: a zero duration is "-".
func (f *KeyspaceField) Cell(ks *Keyspace) string {
	if f.cell != nil {
		return f.cell(ks)
	}
	switch v := f.Value(ks).(type) {
	case time.Duration:
		if v == 0 {
			return "-"
		}
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

// decodeKeyspace decodes one [[keyspace]] through keyspaceFields, then checks what involves several keys or
// the rest of the config. Bounds and derived defaults are warmer's Resolve's, run on every keyspace by
// resolveKeyspaces once all are decoded.
func decodeKeyspace(t *table, c *Config, names map[string]bool, keyTemplates map[string]string) *Keyspace {
	ks := &Keyspace{}
	set := map[string]bool{}
	for i := range keyspaceFields {
		f := &keyspaceFields[i]
		if f.Key == "name" {
			set[f.Key] = name(t, "keyspace", &ks.Name, names)
			continue
		}
		set[f.Key] = f.decode(t, ks)
	}
	for i := range keyspaceFields {
		if f := &keyspaceFields[i]; !set[f.Key] && f.unset != nil {
			f.unset(ks)
		}
	}
	t.done()

	// Templates.
	if !set["key"] || ks.Key == "" {
		if !t.has("key") || ks.Key == "" {
			t.problem("key", "missing (required): the cache key template, e.g. \"track:${id}\"")
		}
	} else {
		keys, err := lockstep.NewKeys(ks.Key, ks.Lock, ks.Stale, ks.Meta)
		if err != nil {
			for _, e := range unjoin(err) {
				msg := e.Error()
				for _, f := range []string{"key", "lock", "stale", "meta"} {
					if rest, ok := strings.CutPrefix(msg, f+" template: "); ok {
						t.problem(f, "%s", rest)
						msg = ""
						break
					}
				}
				if msg != "" {
					t.problem("", "%s", msg)
				}
			}
		} else {
			ks.KeyspaceConfig.Keys = keys
			ks.Lock, ks.Meta = keys.Lock.String(), keys.Meta.String()
			if c.Redis.Mode == ModeCluster {
				if err := keys.CheckCluster(); err != nil {
					mode := "[redis] mode = \"cluster\""
					if env, ok := t.d.fromEnv["redis.mode"]; ok {
						mode = env + "=cluster"
					}
					t.problem("", "%s: %v", mode, err)
				}
			}
		}
		if other, dup := keyTemplates[ks.Key]; dup {
			t.problem("key", "%q is also the key template of keyspace %q", ks.Key, other)
		} else {
			keyTemplates[ks.Key] = ks.Name
		}
	}

	// TTLs. jitter, refresh_ahead, lock_ttl and stale_ttl are checked, and their defaults derived, by warmer's
	// Resolve (resolveKeyspaces): the same check and message as at start-up.
	if !t.has("ttl") {
		t.problem("ttl", "missing (required): how long a written value lives, e.g. \"30s\"")
	}
	if set["stale_ttl"] && !set["stale"] {
		t.problem("stale_ttl", "is set but stale (the stale copy's key template) is not")
	}

	// Queries.
	switch {
	case !set["query"] && t.has("query"):
	case !set["query"] || strings.TrimSpace(ks.Query) == "":
		t.problem("query", "missing (required): SQL taking $1 (a text[] of ids) and returning rows (id, value)")
	case !strings.Contains(ks.Query, "$1"):
		t.problem("query", "does not use $1, the text[] of ids to fetch")
	}
	if strings.Contains(ks.IDsQuery, "$1") {
		t.problem("ids_query", "takes no parameters but uses $1")
	}

	// Missing ids: which keys go together. The policy itself is checked by Resolve.
	if ks.Missing == warmer.MissingTombstone {
		if !set["tombstone_value"] {
			t.problem("tombstone_value", "required with missing = %q", warmer.MissingTombstone)
		}
	} else if set["tombstone_value"] || set["tombstone_ttl"] {
		t.problem("missing", "is not %q but tombstone_value or tombstone_ttl is set: set missing = %q",
			warmer.MissingTombstone, warmer.MissingTombstone)
	}

	// A zero max_tracked is warmer's "the default"; written in the file it is a mistake (Resolve checks the rest:
	// at least top_n).
	if set["max_tracked"] && ks.MaxTracked < 1 {
		t.problem("max_tracked", "%d must be at least top_n (%d) and 1", ks.MaxTracked, ks.TopN)
	}

	// Changes.
	switch {
	case !set["on_change"] && len(ks.FedBy) > 0:
		ks.OnChange = warmer.OnChangeRefresh
	case set["on_change"] && ks.OnChange != warmer.OnChangeRefresh && ks.OnChange != warmer.OnChangeInvalidate:
		t.problem("on_change", "%q is not %q or %q", ks.OnChange, warmer.OnChangeRefresh, warmer.OnChangeInvalidate)
	case set["on_change"] && len(ks.FedBy) == 0:
		t.problem("on_change", "is set but fed_by (the tables that feed this keyspace) is not")
	}
	return ks
}

// parseRefreshAhead reads a fraction of the TTL (0.2, "0.2", "20%") into RefreshAheadFraction, or a duration
// ("2s") into RefreshAhead. The fraction's bound, (0, 1), is checked by Resolve.
func parseRefreshAhead(t *table, ks *Keyspace) bool {
	const key = "refresh_ahead"
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	bad := func() bool {
		t.problem(key, "%s is neither a fraction of the ttl in (0, 1) such as 0.2 or \"20%%\" nor a duration such as \"2s\"", describe(v))
		return false
	}
	var f float64
	switch v := v.(type) {
	case float64:
		f = v
	case int64:
		f = float64(v)
	case string:
		s := strings.TrimSpace(v)
		if p, isPct := strings.CutSuffix(s, "%"); isPct {
			pf, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil {
				return bad()
			}
			f = pf / 100
		} else if pf, err := strconv.ParseFloat(s, 64); err == nil {
			f = pf
		} else if d, err := time.ParseDuration(s); err == nil {
			if d <= 0 {
				t.problem(key, "must be more than 0, got %q", v)
				return false
			}
			ks.RefreshAhead = d
			return true
		} else {
			return bad()
		}
	default:
		return bad()
	}
	if f == 0 || math.IsInf(f, 0) {
		// 0 would read as "the default" to Resolve; inf as no fraction at all.
		t.problem(key, "%g is not a fraction of the ttl in (0, 1) (for a duration write e.g. \"2s\")", f)
		return false
	}
	ks.RefreshAheadFraction = f
	return true
}

// refreshAheadString is refresh_ahead as the file writes it: "20%" or "2s".
func refreshAheadString(ks *Keyspace) any {
	if ks.RefreshAheadFraction > 0 {
		return fmt.Sprintf("%g%%", ks.RefreshAheadFraction*100)
	}
	return ks.RefreshAhead.String()
}

// parseFedBy reads fed_by:
//
//	fed_by = [{ table = "album", id = "album_id" }, { table = "track", id = "album_id" }]
func parseFedBy(t *table, ks *Keyspace) bool {
	const key = "fed_by"
	arr := t.array(key)
	if t.d.known != nil {
		return false
	}
	seen := map[Feed]bool{}
	for i, m := range arr {
		ft := newTable(t.d, fmt.Sprintf("%s: %s[%d]", t.label, key, i), "", m)
		var f Feed
		hasTable := ft.str("table", &f.Table)
		hasID := ft.str("id", &f.ID)
		ft.done()
		switch {
		case !hasTable || f.Table == "":
			ft.problem("table", "missing (required): the table whose changed rows feed this keyspace")
			continue
		case !hasID || f.ID == "":
			ft.problem("id", "missing (required): the column of %s that holds this keyspace's id", f.Table)
			continue
		}
		if _, _, err := stream.SplitTable(f.Table); err != nil {
			ft.problem("table", "%v", err)
			continue
		}
		if !stream.ValidIdent(f.ID) {
			ft.problem("id", "%q is not a plain lower-case column name", f.ID)
			continue
		}
		f.Table = stream.QualifiedTable(f.Table)
		if seen[f] {
			ft.problem("", "%s.%s is listed twice", f.Table, f.ID)
		}
		seen[f] = true
		ks.FedBy = append(ks.FedBy, f)
	}
	return len(ks.FedBy) > 0
}

// WarmerKeyspace returns ks's warmer config with what does not come from its [[keyspace]] table: src (nil when
// only validating), [postgres]'s statement and pool wait timeouts, and the ids its [[hotkeys]] lists pin.
func (c *Config) WarmerKeyspace(ks *Keyspace, src warmer.Source) warmer.KeyspaceConfig {
	w := ks.KeyspaceConfig
	w.Src = src
	w.StatementTimeout, w.PoolWaitTimeout = c.Postgres.StatementTimeout, c.Postgres.PoolWaitTimeout
	w.Pinned = c.Pinned(ks.Name)
	return w
}
