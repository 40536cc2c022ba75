package warmer

import "context"

// Source produces values from the origin (PostgreSQL in keepwarm: package sources/postgres). Fetch returns, for
// a batch of ids, the values it found and the ids it did not; an error fails the whole batch, and the warmer
// applies its fail-safe. The full contract (value bytes, missing ids, duplicates, errors, cancellation, odd ids)
// is written once, in the documentation of package github.com/keepwarm/keepwarm/sources, and checked on every
// backend by sources/sourcetest.
type Source interface {
	Fetch(ctx context.Context, ids []string) (values map[string][]byte, missing []string, err error)
}
