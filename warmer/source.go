package warmer

import "context"

// Source produces values from the origin, the store a hot key is rebuilt from. Each backend is its own package
// under sources/ (sources/postgres), and any type with this method fits. This is the one statement of the
// contract, which sources/sourcetest checks on every backend:
//
//   - Fetch returns, for a batch of ids, the value of every id the origin has (values[id], the exact bytes to
//     write to Redis) and the ids it does not have (missing). Every distinct requested id is in exactly one of
//     the two. An id appearing twice in ids is fetched once. An empty ids gives empty results and no error.
//   - A value is never nil: an origin row whose value is NULL counts as missing.
//   - Returned slices belong to the caller; the source keeps no reference to them.
//   - err != nil means the batch failed as a whole: values and missing are nil, and the warmer applies its
//     fail-safe (retry, extend the stale copy). Errors name the keyspace. Cancellation stays visible: when ctx
//     ends or the backend's own deadline passes, errors.Is(err, context.Canceled) or errors.Is(err,
//     context.DeadlineExceeded) holds, and Fetch returns promptly rather than hanging.
//   - Ids are opaque UTF-8 strings (quotes, spaces, any Unicode, up to lockstep.MaxIDBytes). A backend passes them
//     as bound parameters, never spliced into a query.
//   - A batch that failed on its input rather than on the origin (an id, or that id's row, the query cannot
//     process while the origin is healthy) returns an error with a method BadInput() bool that returns true
//     (sources/postgres: ErrBadInput, for SQLSTATE class 22). The warmer may split the batch to find the id at
//     fault and fetch the others; it does not count such an error as an origin outage.
//   - Fetch is safe for concurrent use.
//
// A backend whose origin cannot hold every id that lockstep accepts also implements IDValidator, so that such
// ids never reach Fetch; Fetch may still refuse one, with a BadInput error.
//
// A backend may also list ids for a warmup, with IDs(ctx, fn func(id string) error) error: it calls fn for
// every id in the origin's order, streaming rather than buffering, and stops with fn's error when fn fails.
type Source interface {
	Fetch(ctx context.Context, ids []string) (values map[string][]byte, missing []string, err error)
}

// IDValidator is implemented by a Source whose origin cannot hold every id that lockstep accepts (postgres.Source:
// no PostgreSQL text can hold a NUL byte). ValidID returns an error for an id the source can never fetch. The
// warmer asks it, after lockstep's own check, wherever an id comes in: access-set members and LFU keys (skipped,
// counted in keepwarm_warmer_invalid_ids_total and logged in the keyspace's invalid-id summary), pinned ids
// (KeyspaceConfig validation: a "pinned" FieldError), warmup and [[schedule]] ids (failed ids of the
// WarmupResult) and the change stream (keepwarm_changes_applied_total{result="invalid_id"}). Such an id would
// otherwise fail every batch it is in. ValidID must be safe for concurrent use.
type IDValidator interface {
	ValidID(id string) error
}

// validID checks id as the keyspace's doors do: lockstep's rules for the key template (Keys.ValidateID), then
// the source's (IDValidator), when it has any.
func (c KeyspaceConfig) validID(id string) error {
	if err := c.Keys.ValidateID(id); err != nil {
		return err
	}
	if v, ok := c.Src.(IDValidator); ok {
		return v.ValidID(id)
	}
	return nil
}
