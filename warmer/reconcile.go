package warmer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reconciliation re-reads hot keys' PTTLs, the ground truth of their expiries, within a command budget and spread
// evenly over time instead of in one burst per interval. How often a key is re-checked depends on what the daemon
// knows about it:
//
//   - trusted: the daemon wrote the current value itself (so it knows its expiry) and keyspace notifications have
//     been confirmed healthy ever since (so a write, delete or eviction by anyone else would have been announced):
//     re-checked every ReconcileTrustedEvery, and each refresh of the key (whose publish reports the TTL the
//     previous value had left) defers the next check by as much;
//   - untrusted: the value was adopted from an app (its expiry learnt with PTTL), or notifications are off or were
//     lost since the daemon wrote it: re-checked every ReconcileEvery, often enough to refresh it before it expires.
//
// A trusted key also skips the PTTL re-check under the lock before its refresh (see keyspace.recheck): nothing
// can have rewritten it without a notification, so a refresh costs two commands (SET NX and the publish script)
// instead of three.
//
// When notifications are lost (the subscription dropped, or a re-check found notify-keyspace-events off), every
// hot key becomes untrusted at once and is re-checked within one ReconcileEvery, spread over it.

// reconcileTick is how often the reconciliation takes its share of the budget: each tick re-checks at most
// ReconcileBudget × tick keys whose check is due. It is ReconcileEvery/10 within [10 ms, 250 ms].
func reconcileTick(cfg KeyspaceConfig) time.Duration {
	return min(250*time.Millisecond, max(10*time.Millisecond, cfg.ReconcileEvery/10))
}

// ownSetWindow is how long after the daemon's own write a "set" notification of the key is taken to be that
// write's own (delivered late), not an app's write. An app's write within it goes unseen until the next check
// (lockstep apps write a key only when it is missing or close to expiry, never just after a refresh).
const ownSetWindow = 30 * time.Second

// trustState is whether the daemon can rely on keyspace notifications, for reconcile.go. healthy mirrors
// NotificationsHealthy; epoch changes whenever events may have been missed (notifications turned off or
// unconfirmed, a subscription re-made after a lost connection), which invalidates every key's trust at once.
type trustState struct {
	healthy atomic.Bool
	epoch   atomic.Uint64
}

// set records whether notifications are confirmed on every node; turning off bumps the epoch.
func (t *trustState) set(on bool) {
	if t.healthy.Swap(on) && !on {
		t.epoch.Add(1)
	}
}

// bump records that events may have been missed (a re-subscribe after a lost connection).
func (t *trustState) bump() { t.epoch.Add(1) }

// trusted reports whether h's expiry is known without asking Redis: the daemon wrote the value itself and
// notifications have been healthy since.
func (k *keyspace) trusted(h *hotState) bool {
	n := &k.w.trust
	return h.ownWrite && n.healthy.Load() && h.notifyEpoch == n.epoch.Load()
}

// markOwnWrite records that the daemon just wrote h's value (so it knows its expiry), and defers its next
// reconciliation check accordingly.
func (k *loopState) markOwnWrite(h *hotState, now time.Time) {
	h.ownWrite = true
	h.ownSetUntil = now.Add(ownSetWindow)
	h.notifyEpoch = k.w.trust.epoch.Load()
	k.scheduleCheck(h, now)
}

// checkInterval is how long h may go without a PTTL check.
func (k *loopState) checkInterval(h *hotState) time.Duration {
	if k.trusted(h) {
		return k.cfg.ReconcileTrustedEvery
	}
	return k.cfg.ReconcileEvery
}

// scheduleCheck sets h's next check at a random point of the second half of its interval from now, so that
// keys learnt together are re-checked spread out rather than in one burst.
func (k *loopState) scheduleCheck(h *hotState, now time.Time) {
	iv := k.checkInterval(h)
	k.cq.schedule(h, now.Add(iv/2+time.Duration(k.rnd.Float64()*float64(iv/2))))
}

// reconcileWanted reports whether h is re-checked at all: the one place where a per-key filter goes: only
// the keys this replica owns (fleet sharing).
func (k *loopState) reconcileWanted(h *hotState) bool {
	return h.e.hot == h && k.owns(h.id)
}

// reconcile re-checks the hot keys whose check is due, at most ReconcileBudget × reconcileTick of them (the
// longest overdue first), with one pipelined PTTL each. It is called every reconcileTick. When notifications were
// lost since the last call, every key's check is first brought forward to a random point within one
// ReconcileEvery.
func (k *loopState) reconcile(ctx context.Context) {
	now := k.w.now()
	if ep := k.w.trust.epoch.Load(); ep != k.checkEpoch {
		k.checkEpoch = ep
		k.recheckAll(now)
	}
	limit := max(1, int(float64(k.cfg.ReconcileBudget)*reconcileTick(k.cfg).Seconds()))
	var hs []*hotState
	var lag time.Duration
	// Keys passed over (in flight, or due soon) are bounded too: in a backlog nearly every hot key is, and
	// passing over all of them on every tick cost O(hot keys × log) per tick (fleet-scale's profile at 300,000
	// keys). Those left wait for the next tick.
	for popped := 0; len(hs) < limit && popped < 8*limit && k.cq.dueBy(now); popped++ {
		h := k.cq.popDue(now, 1)[0]
		if !k.reconcileWanted(h) {
			continue
		}
		lag = max(lag, now.Sub(h.checkAt))
		if h.inflight || (h.idx >= 0 && h.due.Before(now.Add(k.cfg.ReconcileEvery))) {
			// Being refreshed, or due within one interval: the refresh re-learns the expiry (its publish reports
			// the TTL the old value had left), so the check would be spent for nothing. Look again later.
			k.scheduleCheck(h, now)
			continue
		}
		hs = append(hs, h)
	}
	if k.cq.dueBy(now) {
		lag = max(lag, now.Sub(k.cq.peek().checkAt))
	}
	k.w.m.rec.lag.WithLabelValues(k.name).Set(lag.Seconds())
	behind := len(hs) >= limit && lag > k.cfg.ReconcileEvery // the budget, not the tick, held checks back
	first := behind && !k.reconcileBehind
	k.reconcileBehind = behind
	if first {
		k.log.Warn("reconciliation is behind: the hot set needs more PTTL checks per second than reconcile_budget allows; "+
			"checks are spread further apart", "lag", lag, "reconcile_budget", k.cfg.ReconcileBudget)
	}
	if len(hs) == 0 {
		return
	}
	k.w.m.rec.checks.WithLabelValues(k.name).Add(float64(len(hs)))
	if !k.readPTTLs(ctx, hs, "reconcile PTTLs") {
		for _, h := range hs { // try again one interval later rather than hammer a failing Redis
			if k.reconcileWanted(h) && h.cidx < 0 {
				k.scheduleCheck(h, now)
			}
		}
	}
}

// recheckAll brings every hot key's next check forward to a random point within one ReconcileEvery from now
// (never later than it was): events may have been missed, for any key.
func (k *loopState) recheckAll(now time.Time) {
	iv := k.cfg.ReconcileEvery
	for _, h := range k.hotSet {
		if due := now.Add(time.Duration(k.rnd.Float64() * float64(iv))); h.cidx < 0 || due.Before(h.checkAt) {
			k.cq.schedule(h, due)
		}
	}
}

// reconcileMetrics are the reconciliation's metrics.
type reconcileMetrics struct {
	checks *prometheus.CounterVec // keyspace: PTTL checks sent by the reconciliation
	lag    *prometheus.GaugeVec   // keyspace: how overdue the most overdue check was at the last tick
}

func newReconcileMetrics() reconcileMetrics {
	return reconcileMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_reconcile_checks_total",
			Help: "PTTL checks of hot keys sent by the reconciliation (within reconcile_budget per second).",
		}, []string{"keyspace"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_reconcile_lag_seconds",
			Help: "How overdue the most overdue reconciliation check was at the last tick; above reconcile_every, reconcile_budget is too small for the hot set.",
		}, []string{"keyspace"}),
	}
}

func (m reconcileMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.checks, m.lag}
}
