package soak

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keepwarm/keepwarm/internal/benchload"
)

// Causes of a late key that the daemons' freshness counter (keepwarm_changes_late_total) is not expected to
// count, each covered by something else or out of the daemon's reach.
const (
	// causeGone: the key was resolved by its absence (expired, flushed, evicted, invalidated): the daemon counts a
	// key only when it publishes (or invalidates) it for a change, and a key gone before it got there is not.
	causeGone = "gone before the daemon published it"
	// causeOldUnknown: the old album of a move committed while track's replica identity was DEFAULT: the daemon
	// never learnt that the old album changed, and counts the UPDATE in keepwarm_stream_old_ids_unknown_total.
	causeOldUnknown = "old album, replica identity DEFAULT"
	// causePubGap: a change committed while the publication was dropped (or just before), resolved by the
	// publication_gap resync (hot keys refreshed, every other cached key invalidated), which is not a change and
	// not counted late.
	causePubGap = "publication gap, resynced"
)

// Bounds of the publication gap's accounting: changes committed from pubGapLead before the DROP (not acknowledged
// yet when the stream failed, so lost with the old slot) until the resync was seen are the gap's, and each of
// their keys must be resolved within pubGapSlack after the resync was seen (the resync refreshes every hot key and
// invalidates every other cached key of the fed keyspaces, at 20,000 keys a second).
const (
	pubGapLead  = 2 * time.Second
	pubGapSlack = 10 * time.Second
)

// freshRow is one row of the freshness table: the changes committed after a fault (until the next) and the
// daemons' freshness counters over the same period.
type freshRow struct {
	injected, committed, judged       int
	within, late, borderline, never   int
	explained                         int // late keys with a cause the counter is not expected to count
	counted, staleCounted, oldUnknown float64
	hasCounts                         bool
}

// lateKey is one key judged late or never visible, for the report's examples.
type lateKey struct {
	c       *freshChange
	t       *freshTarget
	verdict string
	cause   string
}

// freshSummary is the freshness accounting of a soak (freshAccount).
type freshSummary struct {
	rows                            map[string]*freshRow
	committed, judged, keys         int
	within, late, borderline, never int // changes, by their worst key's verdict
	lateKeys, neverKeys             int
	explained                       map[string]int     // cause → late keys
	events                          map[string]int     // keyspace → unexplained late keys, one per key and resolving poll
	staleLo                         map[string]float64 // keyspace → Σ over those events of the least lateness (seconds)
	counted, staleCounted           map[string]float64 // keyspace → Δ of the daemons' counters over the run
	oldUnknown                      float64
	flips, flipUpdates, flipMoves   int
	pubGaps                         int
	pubGapUncovered                 []lateKey // gap changes' keys resolved after the resync + pubGapSlack
	examples                        []lateKey // the latest, and every never
	p50, p99, longest               time.Duration
}

// freshAccount sums the freshness observer's verdicts on the changes committed between the end of the warm-up and
// the end of the run, attributes each change to the last fault injected before its commit, explains the late keys
// it can (causeGone, causeOldUnknown, causePubGap), and counts the rest as events the daemons' counters must
// cover: one per key and resolving poll (keys resolved at one poll may be one publish, which the daemon counts
// once), with the least lateness the observer can vouch for (the last stale reading's send − the commit's return).
func freshAccount(r *soakResult) *freshSummary {
	s := &freshSummary{rows: map[string]*freshRow{}, explained: map[string]int{}, events: map[string]int{},
		staleLo: map[string]float64{}, counted: map[string]float64{}, staleCounted: map[string]float64{}}
	row := func(k string) *freshRow {
		if s.rows[k] == nil {
			s.rows[k] = &freshRow{}
		}
		return s.rows[k]
	}
	bound := r.freshBound
	row(faultNone).hasCounts = true
	prevKind, prev := faultNone, r.totalsBase
	for _, fr := range r.faults {
		row(fr.Kind).injected++
		row(fr.Kind).hasCounts = true
		addCounts(row(prevKind), fr.totalsAt.sub(prev))
		prevKind, prev = fr.Kind, fr.totalsAt
		switch fr.Kind {
		case faultIdentityFlip:
			s.flips++
		case faultPubRecreate:
			s.pubGaps++
		}
	}
	if r.totalsFinal != nil {
		addCounts(row(prevKind), r.totalsFinal.sub(prev))
		d := r.totalsFinal.sub(r.totalsBase)
		s.counted, s.staleCounted, s.oldUnknown = d.of("late"), d.of("stale_seconds"), d["old_ids_unknown/"]
	}
	type event struct {
		key  string
		poll int64
	}
	least := map[event]time.Duration{}
	eventKS := map[event]string{}
	for _, c := range r.fresh {
		if c.Committed.Before(r.warmEnd) || c.Committed.After(r.end) {
			continue
		}
		kind := lastFaultBefore(c.Committed, r.faults)
		fr := row(kind)
		s.committed++
		fr.committed++
		for _, f := range r.faults {
			if f.Kind == faultIdentityFlip && !c.Started.Before(f.inner[0]) && !c.Committed.After(f.inner[1]) {
				s.flipUpdates++
				if c.Move {
					s.flipMoves++
				}
			}
		}
		if len(c.Targets) == 0 {
			continue
		}
		s.judged++
		fr.judged++
		s.keys += len(c.Targets)
		switch c.verdict(bound) {
		case verdictWithin:
			s.within++
			fr.within++
		case verdictLate:
			s.late++
			fr.late++
		case verdictBorderline:
			s.borderline++
			fr.borderline++
		case verdictNever:
			s.never++
			fr.never++
		}
		for _, t := range c.Targets {
			v := t.verdict(c.Committed, bound)
			switch v {
			case verdictNever:
				s.neverKeys++
				s.examples = append(s.examples, lateKey{c, t, v, ""})
				continue
			case verdictLate:
			default:
				continue
			}
			s.lateKeys++
			cause := lateCause(c, t, r.faults)
			if cause == "" && inPubGap(c, r.faults) {
				s.pubGapUncovered = append(s.pubGapUncovered, lateKey{c, t, v, ""})
			}
			s.examples = append(s.examples, lateKey{c, t, v, cause})
			if cause != "" {
				s.explained[cause]++
				fr.explained++
				continue
			}
			e := event{t.Key, t.Poll}
			if d, ok := least[e]; !ok || t.Lo.Sub(c.Committed) < d {
				least[e] = t.Lo.Sub(c.Committed)
			}
			eventKS[e] = t.Keyspace
		}
	}
	for e, d := range least {
		s.events[eventKS[e]]++
		s.staleLo[eventKS[e]] += d.Seconds()
	}
	slices.SortFunc(s.examples, func(a, b lateKey) int {
		if (a.verdict == verdictNever) != (b.verdict == verdictNever) {
			if a.verdict == verdictNever {
				return -1
			}
			return 1
		}
		return int(b.t.Lo.Sub(b.c.Committed) - a.t.Lo.Sub(a.c.Committed))
	})
	s.p50, s.p99, s.longest = cadence(r.freshGaps)
	return s
}

func addCounts(x *freshRow, d counterSet) {
	x.counted += sumOf(d.of("late"))
	x.staleCounted += sumOf(d.of("stale_seconds"))
	x.oldUnknown += d["old_ids_unknown/"]
}

// lastFaultBefore names the kind of the last fault injected at or before at (faultNone before the first).
func lastFaultBefore(at time.Time, faults []faultRecord) string {
	kind := faultNone
	for _, f := range faults {
		if f.started.After(at) {
			break
		}
		kind = f.Kind
	}
	return kind
}

// inPubGap reports whether c was committed in a publication gap: from pubGapLead before a DROP until the
// resync was seen.
func inPubGap(c *freshChange, faults []faultRecord) bool {
	for _, f := range faults {
		if f.Kind == faultPubRecreate && !f.outer[0].IsZero() && !c.Committed.Before(f.outer[0].Add(-pubGapLead)) &&
			!c.Committed.After(f.outer[1]) {
			return true
		}
	}
	return false
}

// lateCause returns why the daemons' freshness counter need not count late key t of change c ("": it must).
func lateCause(c *freshChange, t *freshTarget, faults []faultRecord) string {
	if t.Absent {
		return causeGone
	}
	for _, f := range faults {
		switch {
		case f.Kind == faultIdentityFlip && t.Role == roleOldAlbum && !f.outer[0].IsZero() &&
			!c.Committed.Before(f.outer[0]) && !c.Started.After(f.outer[1]):
			return causeOldUnknown
		case f.Kind == faultPubRecreate && inPubGap(c, []faultRecord{f}) && !t.Hi.After(f.outer[1].Add(pubGapSlack)):
			return causePubGap
		}
	}
	return ""
}

// printFreshness prints the freshness table, the observer's cadence and the worst keys.
func (s *freshSummary) print(w io.Writer, r *soakResult) {
	fmt.Fprintf(w, "\nfreshness (the observer's verdicts on the updater's commits after the warm-up, by the last fault injected before the commit; a change is judged on the keys cached when it committed, and takes its worst key's verdict; counted = Σ of the replicas' keepwarm_changes_late_total from that fault to the next)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "fault\tinjected\tcommitted\tjudged\twithin %v\tlate\tborderline\tnever\tlate keys explained\tcounted late\tstale s counted\told ids unknown\t\n", r.freshBound)
	order := append([]string{faultNone}, allFaults...)
	for _, k := range order {
		x := s.rows[k]
		if x == nil {
			continue
		}
		counted, stale, old := "-", "-", "-"
		if x.hasCounts {
			counted, stale, old = fmt.Sprintf("%.0f", x.counted), fmt.Sprintf("%.1f", x.staleCounted), fmt.Sprintf("%.0f", x.oldUnknown)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", k, x.injected, x.committed, x.judged, x.within, x.late,
			x.borderline, x.never, x.explained, counted, stale, old)
	}
	fmt.Fprintf(tw, "total\t\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.1f\t%.0f\t\n", s.committed, s.judged, s.within, s.late, s.borderline,
		s.never, sumInts(s.explained), sumOf(s.counted), sumOf(s.staleCounted), s.oldUnknown)
	_ = tw.Flush()
	fmt.Fprintf(w, "freshness observer: %d polls that read (%d failed as a whole), interval p50 %v, p99 %v, longest %v; %d keys judged for %d changes",
		r.freshPolls, r.freshBlind, s.p50.Round(time.Millisecond), s.p99.Round(time.Millisecond), s.longest.Round(time.Millisecond), s.keys, s.judged)
	if r.freshSkipped > 0 {
		fmt.Fprintf(w, "; %d changes not judged (its bound of keys pending was reached)", r.freshSkipped)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "late keys: %d (%d never visible); explained:", s.lateKeys, s.neverKeys)
	if len(s.explained) == 0 {
		fmt.Fprint(w, " none")
	}
	for _, c := range slices.Sorted(maps.Keys(s.explained)) {
		fmt.Fprintf(w, " %d %s;", s.explained[c], c)
	}
	fmt.Fprintf(w, " the others, as the daemons' counters must see them (one per key and publish), by keyspace:")
	for _, ks := range slices.Sorted(maps.Keys(s.events)) {
		fmt.Fprintf(w, " %s %d (at least %.1f s stale)", ks, s.events[ks], s.staleLo[ks])
	}
	fmt.Fprintln(w)
	if len(s.examples) > 0 {
		fmt.Fprintln(w, "latest keys (late: at least .. at most after the commit returned):")
		for _, x := range s.examples[:min(10, len(s.examples))] {
			when := fmt.Sprintf("%s .. %s", benchload.Dur(x.t.Lo.Sub(x.c.Committed)), benchload.Dur(x.t.Hi.Sub(x.c.Committed)))
			if x.verdict == verdictNever {
				when = "never (stale at the last reading, " + benchload.Dur(x.t.LastStale.Sub(x.c.Committed)) + " after)"
			}
			cause := x.cause
			if cause == "" {
				cause = "to be counted"
			}
			fmt.Fprintf(w, "  %-16s %-10s track %s %-9s committed at %7v, %s after %s  [%s]\n", x.t.Key, x.t.Role, x.c.Track, x.c.Name,
				x.c.Committed.Sub(r.start).Round(100*time.Millisecond), when, lastFaultBefore(x.c.Committed, r.faults), cause)
		}
	}
}

func sumInts(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

// freshnessLegend says what the freshness checks prove and what they cannot.
const freshnessLegend = `freshness checks, what they prove and what they cannot:
  - "visible within" is judged from outside: a key is fresh when it shows the committed row (or a later one) or
    is gone, dated from the moment the commit returned (visible to any new snapshot by then; it became visible
    a little earlier, so the observer's lateness is never more than the real one). Only keys cached when the
    update committed are judged. "late" means a reading sent more than the bound after the commit still found
    the old row: certain; "borderline" means the readings straddle the bound: not counted either way.
  - "late changes counted" compares, per keyspace, the late keys the daemon must have published late (not gone
    first, not explained below), one per key and resolving poll, with the growth of Σ keepwarm_changes_late_total
    over replicas and incarnations. The counter has no key label: a count of another key can hide a miss, and a
    kill -9 loses what the victim counted after its last scrape. It can fail spuriously only if a key is brought
    up to date by another writer (refresh-ahead, an app) and then leaves the cache, or an app holds its lock,
    when the daemon gets to the change (not_cached, locked: not counted, by the SLO's definition).
  - "stale seconds counted" does the same with the least lateness the observer can vouch for and
    keepwarm_changes_stale_seconds_total (the daemon dates from an earlier moment, its lower bound of visibility,
    so its seconds are at least these).
  - replica-identity-flip: moves committed while track's identity was DEFAULT leave the old album stale, which
    the daemon cannot see; the check is that keepwarm_stream_old_ids_unknown_total grew by at least the updates
    the observer saw sent and committed inside the window. It proves the counter counts them, not which ones.
  - publication-recreate: changes committed from 2 s before the DROP until the publication_gap resync was seen
    are not streamed; the check is that each of their late keys was resolved within 10 s of the resync being
    seen. It cannot tell the resync's invalidation from a TTL expiry that happened to come in time.
  - "cached values equal to PostgreSQL" compares every cached key of the fed keyspaces after the settle: a stale
    value that expired before the end is not seen there, only by the observer.`

// freshChecks runs the freshness checks through check.
func (s *freshSummary) checks(r *soakResult, f Options, check func(ok bool, name, got, detail string)) {
	check(s.judged > 0, "freshness observer judged changes", fmt.Sprintf("%d of %d committed changes, %d keys", s.judged, s.committed, s.keys),
		"no change was judged (no key was cached when its update committed): the freshness checks would pass vacuously")
	check(s.p99 <= f.FreshMaxP99, fmt.Sprintf("freshness observer kept its cadence (p99 interval <= %v)", f.FreshMaxP99),
		fmt.Sprintf("p50 %v, p99 %v, longest %v, %d borderline changes", s.p50.Round(time.Millisecond), s.p99.Round(time.Millisecond),
			s.longest.Round(time.Millisecond), s.borderline),
		"the observer read too seldom to judge a 1 s bound: its verdicts would be borderline, not late")
	neverDetail := ""
	for _, x := range s.examples {
		if x.verdict == verdictNever {
			neverDetail = fmt.Sprintf("e.g. %s (%s) of track %s's update to %q, committed at %v", x.t.Key, x.t.Role, x.c.Track, x.c.Name,
				x.c.Committed.Sub(r.start).Round(100*time.Millisecond))
			break
		}
	}
	check(s.never == 0, "no change left stale at the end (never visible)", fmt.Sprintf("%d changes, %d keys", s.never, s.neverKeys), neverDetail)
	var short []string
	for _, ks := range slices.Sorted(maps.Keys(s.events)) {
		if float64(s.events[ks]) > s.counted[ks] {
			short = append(short, fmt.Sprintf("%s: %d late keys observed, %.0f counted", ks, s.events[ks], s.counted[ks]))
		}
	}
	check(len(short) == 0, "late changes counted by keepwarm_changes_late_total (per keyspace, counted >= observed)",
		fmt.Sprintf("%d observed (unexplained), %.0f counted", sumInts(s.events), sumOf(s.counted)), strings.Join(short, "; "))
	short = nil
	for _, ks := range slices.Sorted(maps.Keys(s.staleLo)) {
		if s.staleLo[ks] > s.staleCounted[ks]+0.001 {
			short = append(short, fmt.Sprintf("%s: at least %.1f s observed, %.1f s counted", ks, s.staleLo[ks], s.staleCounted[ks]))
		}
	}
	check(len(short) == 0, "stale seconds counted by keepwarm_changes_stale_seconds_total (per keyspace)",
		fmt.Sprintf("at least %.1f s observed, %.1f s counted", sumOf(s.staleLo), sumOf(s.staleCounted)), strings.Join(short, "; "))
	if s.flips > 0 {
		check(s.oldUnknown >= float64(s.flipUpdates), "updates without their old row counted by keepwarm_stream_old_ids_unknown_total",
			fmt.Sprintf("%d flips: %d updates (%d moves) sent and committed while DEFAULT, %.0f counted", s.flips, s.flipUpdates, s.flipMoves, s.oldUnknown),
			"the daemons counted fewer UPDATEs without an old row than were committed while the identity was DEFAULT")
	}
	if s.pubGaps > 0 {
		d := ""
		if len(s.pubGapUncovered) > 0 {
			x := s.pubGapUncovered[0]
			d = fmt.Sprintf("e.g. %s (%s) resolved %s after its commit", x.t.Key, x.t.Role, benchload.Dur(x.t.Hi.Sub(x.c.Committed)))
		}
		check(len(s.pubGapUncovered) == 0, "publication gaps covered by the publication_gap resync",
			fmt.Sprintf("%d gaps, %d late keys explained by a resync, %d resolved later than %v after it", s.pubGaps, s.explained[causePubGap],
				len(s.pubGapUncovered), pubGapSlack), d)
	}
}
