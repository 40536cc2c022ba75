// Package sources documents where keepwarm's values come from: the origin that a hot key is rebuilt from.
//
// Each backend is its own package (sources/postgres). The interface lives where it is consumed, as
// warmer.Source (Fetch(ctx, ids) (values map[string][]byte, missing []string, err error)), and any backend with
// that method fits. This is the one statement of its contract, which sources/sourcetest checks on every backend:
//
//   - Fetch returns, for a batch of ids, the value of every id the origin has (values[id], the exact bytes to
//     write to Redis) and the ids it does not have (missing). Every distinct requested id is in exactly one of
//     the two. An id appearing twice in ids is fetched once. An empty ids gives empty results and no error.
//   - A value is never nil: an origin row whose value is NULL counts as missing.
//   - Returned slices belong to the caller; the source keeps no reference to them.
//   - err != nil means the batch failed as a whole: values and missing are nil, and the caller decides (retry,
//     extend the stale copy). Errors name the keyspace. Cancellation stays visible: when ctx ends or the
//     backend's own deadline passes, errors.Is(err, context.Canceled) or errors.Is(err,
//     context.DeadlineExceeded) holds, and Fetch returns promptly rather than hanging.
//   - Ids are opaque UTF-8 strings (quotes, spaces, any Unicode, up to lockstep.MaxIDBytes). A backend passes them
//     as bound parameters, never spliced into a query.
//   - A batch that failed on its input rather than on the origin (an id, or that id's row, the query cannot
//     process while the origin is healthy) returns an error with a method BadInput() bool that returns true
//     (sources/postgres: ErrBadInput, for SQLSTATE class 22). The caller may split the batch to find the id at
//     fault and fetch the others; it does not count such an error as an origin outage.
//   - Fetch is safe for concurrent use.
//
// A backend whose origin cannot hold every id that lockstep accepts implements ValidID(id string) error
// (warmer.IDValidator; sources/postgres refuses a NUL byte, which no PostgreSQL text can hold): the warmer asks it
// wherever ids come in (access set, LFU scan, pinned ids, warmups, the change stream) and skips and counts the
// ids it refuses, so that they never reach Fetch. Fetch may still refuse such an id, with a BadInput error.
//
// A backend may also list ids for a warmup, with IDs(ctx, fn func(id string) error) error: it calls fn for
// every id in the origin's order, streaming rather than buffering, and stops with fn's error when fn fails.
package sources
