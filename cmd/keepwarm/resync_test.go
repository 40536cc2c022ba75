package main

import (
	"testing"

	"github.com/keepwarm/keepwarm/sources/postgres/stream"
	"github.com/keepwarm/keepwarm/warmer"
)

// The stream names a TRUNCATE's resync with its own constant and the warmer acts on its own (neither package
// imports the other); the daemon wires them together, so they must agree.
func TestResyncTruncateNamesAgree(t *testing.T) {
	t.Parallel()
	if stream.ResyncTruncate != warmer.ResyncTruncate {
		t.Errorf("stream.ResyncTruncate = %q, warmer.ResyncTruncate = %q: a TRUNCATE would not invalidate cold keys",
			stream.ResyncTruncate, warmer.ResyncTruncate)
	}
}
