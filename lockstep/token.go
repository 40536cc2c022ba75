package lockstep

import (
	"crypto/rand"
	"encoding/hex"
)

// TokenBytes is the number of random bytes in a token made by NewToken (128 bits).
const TokenBytes = 16

// NewToken returns a fresh lock token: 128 bits from crypto/rand as 32 lowercase hex characters, e.g.
// "9f86d081884c7d659a2feaa0c55ad015". Every rebuild uses its own token; the lock protocol accepts any non-empty
// string as a token (a UUID from another app works), but a token must never be reused.
func NewToken() string {
	var b [TokenBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (Go 1.24+); it crashes the program instead.
	return hex.EncodeToString(b[:])
}
