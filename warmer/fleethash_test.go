package warmer

import (
	"strconv"
	"testing"
)

// TestRendezvousBalancesAndMovesOnlyLostKeys checks the two properties the fleet relies on: every id has exactly
// one owner among the replicas, the shares are even, and when a replica leaves only its own ids move.
func TestRendezvousBalancesAndMovesOnlyLostKeys(t *testing.T) {
	t.Parallel()
	const n = 30000
	three := []string{"host-a-101", "host-b-202", "host-c-303"}
	owner := func(members []string, id string) string {
		found := ""
		for _, m := range members {
			if testView(m, members...).owns(id) {
				if found != "" {
					t.Fatalf("id %s owned by %s and %s", id, found, m)
				}
				found = m
			}
		}
		if found == "" {
			t.Fatalf("id %s owned by nobody among %v", id, members)
		}
		return found
	}
	share := map[string]int{}
	before := make([]string, n)
	for i := range n {
		before[i] = owner(three, strconv.Itoa(i))
		share[before[i]]++
	}
	for _, m := range three {
		if got, want := share[m], n/3; got < want*95/100 || got > want*105/100 {
			t.Errorf("%s owns %d of %d ids, want %d ± 5%%", m, got, n, want)
		}
	}
	moved := 0
	for i := range n {
		after := owner(three[:2], strconv.Itoa(i))
		if before[i] != three[2] && after != before[i] {
			t.Fatalf("id %d moved from %s to %s although its owner stayed", i, before[i], after)
		}
		if after != before[i] {
			moved++
		}
	}
	if moved != share[three[2]] {
		t.Errorf("%d ids moved, want the %d of the replica that left", moved, share[three[2]])
	}
	if !(*fleetView)(nil).owns("1") || !soloView("x").owns("1") {
		t.Error("without a fleet, a replica must own every key")
	}
}
