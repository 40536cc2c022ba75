package warmer

import "context"

// Source produces values from the origin (PostgreSQL in keepwarm; see package sources/postgres).
//
// Fetch returns the value of every id it found, keyed by id, and the ids it did not find (a missing row or a NULL
// value). Every requested id is in exactly one of the two. Value bytes are written to Redis exactly as returned.
// An error means the whole batch failed (origin down, timeout, SQL error); the warmer then applies its
// fail-safe. Fetch must honour ctx's deadline.
type Source interface {
	Fetch(ctx context.Context, ids []string) (values map[string][]byte, missing []string, err error)
}
