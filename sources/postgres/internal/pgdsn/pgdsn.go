// Package pgdsn holds what the PostgreSQL source (sources/postgres) and the change stream (sources/postgres/stream)
// both do with a connection string.
package pgdsn

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5/pgconn"
)

// Scrub keeps only the reason of a connection string parse error. pgconn masks the password in the string it
// quotes, but only on a best-effort basis for malformed input, and net/url quotes the whole URL: the error
// returned never contains the password.
func Scrub(err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return err
	}
	inner := errors.Unwrap(pce)
	var ue *url.Error
	switch {
	case inner == nil:
		return errors.New("invalid connection string")
	case errors.As(inner, &ue):
		return fmt.Errorf("invalid URL: %w", ue.Err)
	}
	return inner
}
