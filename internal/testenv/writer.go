package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// WriteEvery writes path (a new counter each time) every interval from now until the test ends or for d, whichever
// comes first; the first write is done when it returns. appendLines appends a comment line instead of replacing the
// file, for the watched file itself. It returns a channel closed when the writer has stopped.
func WriteEvery(t testing.TB, path string, interval, d time.Duration, appendLines bool) <-chan struct{} {
	t.Helper()
	writeOnce := func(n int) error {
		if !appendLines {
			return os.WriteFile(path, []byte(fmt.Sprintf("%d\n", n)), 0o644)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(f, "# touch %d\n", n); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := writeOnce(0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := writeOnce(n); err != nil {
					t.Errorf("writer of %s: %v", path, err)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return done
}
