package warmer

import (
	"container/heap"
	"math"
	"time"
)

// dueAt returns when a key expiring at expiry should be refreshed: expiry − lead − an XFetch-style early offset.
// The offset is δ·β·(−ln u) with δ the rebuild estimate, β = 1 and u in (0,1], i.e. the moment at which XFetch's
// test "now − δβ·ln(u) ≥ expiry" first holds for one draw (Vattani, Chierichetti, Lowenstein, "Optimal
// Probabilistic Cache Stampede Prevention", VLDB 2015). Several daemon replicas draw different u and so do not
// collide on the same key at the same instant. The offset is capped at lead/2 so the spread never doubles the
// lead.
func dueAt(expiry time.Time, ld, rebuild time.Duration, u float64) time.Time {
	if u <= 0 || u > 1 {
		u = 1
	}
	early := time.Duration(float64(rebuild) * -math.Log(u))
	early = min(early, ld/2)
	return expiry.Add(-ld - early)
}

// dueQueue is a min-heap of hot keys by due time; at equal due times the hotter key comes first, so that when the
// origin budget is short the keys closest to expiry and with the highest heat are refreshed first.
type dueQueue []*hotState

func (q dueQueue) Len() int { return len(q) }
func (q dueQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].e.score > q[j].e.score
}
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx = i
	q[j].idx = j
}
func (q *dueQueue) Push(x any) {
	h := x.(*hotState)
	h.idx = len(*q)
	*q = append(*q, h)
}
func (q *dueQueue) Pop() any {
	old := *q
	n := len(old)
	h := old[n-1]
	old[n-1] = nil
	h.idx = -1
	*q = old[:n-1]
	return h
}

// schedule puts h in the queue at due, or moves it there if it is queued already.
func (q *dueQueue) schedule(h *hotState, due time.Time) {
	h.due = due
	if h.idx >= 0 {
		heap.Fix(q, h.idx)
		return
	}
	heap.Push(q, h)
}

// remove takes h out of the queue if it is there.
func (q *dueQueue) remove(h *hotState) {
	if h.idx >= 0 {
		heap.Remove(q, h.idx)
	}
}

// peek returns the first key, or nil.
func (q dueQueue) peek() *hotState {
	if len(q) == 0 {
		return nil
	}
	return q[0]
}

// popDue removes and returns up to n keys due at or before until, in queue order.
func (q *dueQueue) popDue(until time.Time, n int) []*hotState {
	var out []*hotState
	for len(*q) > 0 && len(out) < n {
		h := (*q)[0]
		if h.due.After(until) {
			break
		}
		heap.Pop(q)
		out = append(out, h)
	}
	return out
}
