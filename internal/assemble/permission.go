package assemble

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// Permission names a permission error anywhere in err's chain, or returns "" for any other error:
//
//   - Redis "NOPERM" (an ACL user lacks a command, key or channel): "redis NOPERM: the ACL user lacks a command,
//     key or channel (docs/operations.md, \"Least privilege\")"
//   - Redis "WRONGPASS" or "NOAUTH": the credentials are wrong or missing
//   - PostgreSQL SQLSTATE 42501 insufficient_privilege: the role lacks a grant
//   - PostgreSQL SQLSTATE 28P01 or 28000: authentication failed
//
// The daemon logs it under "permission" and /readyz adds it, because such errors otherwise read like an outage
// ("cannot reach a dependency") or a missing migration. It never includes a secret.
func Permission(err error) string {
	if err == nil {
		return ""
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "NOPERM"):
			return `redis NOPERM: the ACL user lacks a command, key or channel (docs/operations.md, "Least privilege")`
		case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"):
			return "redis authentication failed: check [redis] username and KEEPWARM_REDIS_PASSWORD"
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501":
			return `postgres 42501 insufficient_privilege: the role lacks a grant (docs/operations.md, "Least privilege")`
		case "28P01", "28000":
			return "postgres authentication failed: check the user and password of KEEPWARM_POSTGRES_DSN"
		}
	}
	return ""
}
