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
