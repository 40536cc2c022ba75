package testenv

import (
	"strings"
	"sync"
)

// LogBuffer collects log output for a test: safe for a daemon's concurrent writes and the test's reads.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count returns how many times sub occurs in what was written so far.
func (l *LogBuffer) Count(sub string) int { return strings.Count(l.String(), sub) }
