package lockstep

import (
	"strconv"
	"testing"
)

// TestNearShardInvalidatedSince: a fill whose ticket predates invalidations of other keys only is not refused (a
// daemon batch's publish invalidates many keys of a shard at once, and refusing every fill in flight then kept
// 6% of a peers cell's hot reads going to Redis); one whose own key was invalidated since is; and more
// invalidations than the shard remembers refuse every fill, since the key may be among the forgotten.
func TestNearShardInvalidatedSince(t *testing.T) {
	t.Parallel()
	var sh nearShard
	inval := func(key string) { sh.seq++; sh.recent[sh.seq%nearRecent] = key } // as nearStore.invalidate does
	inval("a")
	ticket := sh.seq
	if sh.invalidatedSince(ticket, "k") {
		t.Fatal("no invalidation since the ticket: refused")
	}
	inval("b")
	inval("c")
	if sh.invalidatedSince(ticket, "k") {
		t.Error("only other keys invalidated since the ticket: refused")
	}
	if !sh.invalidatedSince(ticket, "b") {
		t.Error("b invalidated since the ticket: not refused")
	}
	if sh.invalidatedSince(ticket, "a") {
		t.Error("a was invalidated before the ticket: refused")
	}
	for i := range nearRecent {
		inval("x" + strconv.Itoa(i))
	}
	if !sh.invalidatedSince(ticket, "k") {
		t.Errorf("%d invalidations since the ticket, more than the %d remembered: not refused", nearRecent+2, nearRecent)
	}
}
