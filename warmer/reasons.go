package warmer

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
)

// poolExhausted is implemented by an origin error that means no connection was free within the source's pool
// wait bound (sources/postgres: ErrPoolExhausted), as opposed to a query that failed or ran too long.
type poolExhausted interface{ PoolExhausted() bool }

// badInput is implemented by an origin error that means the batch failed on its input (an id, or its row, that
// the query cannot process: sources/postgres ErrBadInput, SQLSTATE class 22), not on the origin.
type badInput interface{ BadInput() bool }

// isBadInput reports whether err is a Source error that blames the batch's input (see badInput).
func isBadInput(err error) bool {
	var bi badInput
	return errors.As(err, &bi) && bi.BadInput()
}

// originReason classifies a failed origin query for the reason label.
func originReason(err error) string {
	var pe poolExhausted
	switch {
	case errors.As(err, &pe) && pe.PoolExhausted():
		return ReasonPoolExhausted
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonOriginTimeout
	default:
		return ReasonOrigin
	}
}

// redisReason classifies a failed Redis call for the reason label: an error reply by its prefix, anything else
// (timeout, reset, refused, a closed pool) as transport.
func redisReason(err error) string {
	switch {
	case redis.HasErrorPrefix(err, "OOM"):
		return ReasonOOM
	case redis.HasErrorPrefix(err, "TRYAGAIN"):
		return ReasonTryAgain
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return ReasonWrongType
	case redis.HasErrorPrefix(err, "MOVED"), redis.HasErrorPrefix(err, "ASK"), redis.HasErrorPrefix(err, "CLUSTERDOWN"),
		redis.HasErrorPrefix(err, "CROSSSLOT"):
		return ReasonCluster
	case isErrorReply(err):
		return ReasonReply
	default:
		return ReasonTransport
	}
}

// isErrorReply reports whether err is an error reply of the server about one command, as opposed to a transport
// failure (timeout, reset, refused) after which the command may or may not have run.
func isErrorReply(err error) bool {
	var re redis.Error
	var ne net.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil) && !errors.As(err, &ne)
}
