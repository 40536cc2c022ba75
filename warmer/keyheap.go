package warmer

import (
	"container/heap"
	"time"
)

// keyOrder is one ordering of hot keys for a keyHeap: less compares two keys, at returns the key's position
// field (-1 when not in the heap) and its time in this order.
type keyOrder interface {
	less(a, b *hotState) bool
	pos(h *hotState) *int
	at(h *hotState) *time.Time
}

// keyHeap is a min-heap of hot keys in which every key keeps its own position, so that it is moved or removed
// in O(log n) (container/heap). Two orders use it over the same keys: the due queue (byDue) and the
// reconciliation's check queue (byCheck). The zero value is an empty heap.
type keyHeap[O keyOrder] struct {
	keys []*hotState
}

// heap.Interface, for container/heap only.
func (q *keyHeap[O]) Len() int           { return len(q.keys) }
func (q *keyHeap[O]) Less(i, j int) bool { var o O; return o.less(q.keys[i], q.keys[j]) }
func (q *keyHeap[O]) Swap(i, j int) {
	var o O
	q.keys[i], q.keys[j] = q.keys[j], q.keys[i]
	*o.pos(q.keys[i]) = i
	*o.pos(q.keys[j]) = j
}
func (q *keyHeap[O]) Push(x any) {
	var o O
	h := x.(*hotState)
	*o.pos(h) = len(q.keys)
	q.keys = append(q.keys, h)
}
func (q *keyHeap[O]) Pop() any {
	var o O
	n := len(q.keys)
	h := q.keys[n-1]
	q.keys[n-1] = nil
	*o.pos(h) = -1
	q.keys = q.keys[:n-1]
	return h
}

// schedule puts h in the heap at t, or moves it there if it is in the heap already.
func (q *keyHeap[O]) schedule(h *hotState, t time.Time) {
	var o O
	*o.at(h) = t
	if i := *o.pos(h); i >= 0 {
		heap.Fix(q, i)
		return
	}
	heap.Push(q, h)
}

// remove takes h out of the heap if it is there.
func (q *keyHeap[O]) remove(h *hotState) {
	var o O
	if i := *o.pos(h); i >= 0 {
		heap.Remove(q, i)
	}
}

// peek returns the first key, or nil.
func (q *keyHeap[O]) peek() *hotState {
	if len(q.keys) == 0 {
		return nil
	}
	return q.keys[0]
}

// dueBy reports whether the first key's time is at or before until.
func (q *keyHeap[O]) dueBy(until time.Time) bool {
	var o O
	return len(q.keys) > 0 && !o.at(q.keys[0]).After(until)
}

// popDue removes and returns up to n keys whose time is at or before until, in heap order.
func (q *keyHeap[O]) popDue(until time.Time, n int) []*hotState {
	var out []*hotState
	for len(out) < n && q.dueBy(until) {
		out = append(out, heap.Pop(q).(*hotState))
	}
	return out
}

// countBy returns how many keys' times are at or before until, in O(that count): a subtree whose root is
// later than until holds no such key (the heap's order), so it is not visited.
func (q *keyHeap[O]) countBy(until time.Time) int {
	var o O
	n := 0
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(q.keys) || o.at(q.keys[i]).After(until) {
			continue
		}
		n++
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return n
}

// byDue orders the due queue: by due time; at equal due times the hotter key first, so that when the origin
// budget is short the keys closest to expiry and with the highest heat are refreshed first.
type byDue struct{}

func (byDue) less(a, b *hotState) bool {
	if !a.due.Equal(b.due) {
		return a.due.Before(b.due)
	}
	return a.e.score > b.e.score
}
func (byDue) pos(h *hotState) *int      { return &h.idx }
func (byDue) at(h *hotState) *time.Time { return &h.due }

// byCheck orders the reconciliation's check queue: by the time of the next PTTL check.
type byCheck struct{}

func (byCheck) less(a, b *hotState) bool  { return a.checkAt.Before(b.checkAt) }
func (byCheck) pos(h *hotState) *int      { return &h.cidx }
func (byCheck) at(h *hotState) *time.Time { return &h.checkAt }

// dueQueue is the hot keys by due time (byDue).
type dueQueue = keyHeap[byDue]

// checkQueue is the hot keys by the time of their next PTTL check (byCheck).
type checkQueue = keyHeap[byCheck]
