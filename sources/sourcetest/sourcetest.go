// Package sourcetest is the conformance suite that every keepwarm source backend runs: it checks the contract
// documented on warmer.Source (values byte for byte, missing ids, duplicates, odd ids, big batches,
// concurrency, cancellation, and the optional IDs listing).
//
// A backend's test calls Run with a function that builds a fresh Fixture:
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, func(t *testing.T) sourcetest.Fixture {
//			// create an origin holding some values, including sourcetest.OddIDs()
//			return sourcetest.Fixture{Source: src, Known: values, Listed: ids}
//		})
//	}
package sourcetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Source is the method every backend implements; the warmer declares the same interface.
type Source interface {
	Fetch(ctx context.Context, ids []string) (values map[string][]byte, missing []string, err error)
}

// Lister is implemented by backends that can list ids for warmups.
type Lister interface {
	IDs(ctx context.Context, fn func(id string) error) error
}

// Fixture is one backend instance over an origin whose content the test knows.
type Fixture struct {
	// Source is the backend under test.
	Source Source
	// Known maps every id the origin has to its exact value. It needs at least 3 entries; include OddIDs() so
	// that they are checked as known ids, not only as missing ones.
	Known map[string][]byte
	// Listed is what IDs must produce, in order, when Source implements Lister. nil skips the listing checks.
	Listed []string
}

// OddIDs returns ids that break naive backends: quotes, SQL and format syntax, spaces, Unicode, a 1 KB id.
func OddIDs() []string {
	return []string{
		`it's`,
		`say "hi"`,
		`'); drop table track; --`,
		`back\slash`,
		`  leading and trailing spaces  `,
		`{tag}:${id}:%s:$1`,
		"tab\tand\nnewline",
		"Mötley Crüe — 東京 🎸",
		strings.Repeat("x", 1024),
	}
}

// Run runs the suite. newFixture is called once per subtest, with that subtest's t for cleanup.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture) {
	t.Helper()
	fixture := func(t *testing.T) Fixture {
		t.Helper()
		f := newFixture(t)
		if f.Source == nil || len(f.Known) < 3 {
			t.Fatalf("sourcetest: fixture needs a Source and at least 3 known ids, got %d", len(f.Known))
		}
		return f
	}

	t.Run("known ids return exact values", func(t *testing.T) {
		f := fixture(t)
		values, missing := fetch(t, f.Source, keys(f.Known))
		checkPartition(t, f.Known, keys(f.Known), values, missing)
	})

	t.Run("unknown ids are missing", func(t *testing.T) {
		f := fixture(t)
		ids := unknownIDs(f.Known, 5)
		values, missing := fetch(t, f.Source, ids)
		checkPartition(t, f.Known, ids, values, missing)
	})

	t.Run("odd ids are bound not spliced", func(t *testing.T) {
		f := fixture(t)
		ids := OddIDs()
		values, missing := fetch(t, f.Source, ids)
		checkPartition(t, f.Known, ids, values, missing)
	})

	t.Run("duplicates are fetched once", func(t *testing.T) {
		f := fixture(t)
		k := keys(f.Known)[0]
		u := unknownIDs(f.Known, 1)[0]
		ids := []string{k, u, k, u, k}
		values, missing := fetch(t, f.Source, ids)
		checkPartition(t, f.Known, ids, values, missing)
	})

	t.Run("empty batch", func(t *testing.T) {
		f := fixture(t)
		for _, ids := range [][]string{nil, {}} {
			values, missing := fetch(t, f.Source, ids)
			if len(values) != 0 || len(missing) != 0 {
				t.Errorf("Fetch(%v): got %d values and %d missing, want none", ids, len(values), len(missing))
			}
		}
	})

	t.Run("5000 ids in one call", func(t *testing.T) {
		f := fixture(t)
		ids := append(keys(f.Known), unknownIDs(f.Known, 5000-len(f.Known))...)
		values, missing := fetch(t, f.Source, ids)
		checkPartition(t, f.Known, ids, values, missing)
	})

	t.Run("caller owns the returned values", func(t *testing.T) {
		f := fixture(t)
		ids := keys(f.Known)
		values, _ := fetch(t, f.Source, ids)
		for _, v := range values {
			for i := range v {
				v[i] ^= 0xff
			}
		}
		values, missing := fetch(t, f.Source, ids)
		checkPartition(t, f.Known, ids, values, missing)
	})

	t.Run("concurrent fetches", func(t *testing.T) {
		f := fixture(t)
		known := keys(f.Known)
		var wg sync.WaitGroup
		errs := make(chan error, 8*10)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 10 {
					ids := []string{known[(g+i)%len(known)], known[(g+2*i)%len(known)], fmt.Sprintf("sourcetest-absent-%d-%d", g, i)}
					values, missing, err := f.Source.Fetch(context.Background(), ids)
					if err != nil {
						errs <- err
						return
					}
					if err := partitionError(f.Known, ids, values, missing); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("cancelled context", func(t *testing.T) {
		f := fixture(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		values, missing, err := f.Source.Fetch(ctx, keys(f.Known))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Fetch with a cancelled context: got err %v, want one wrapping context.Canceled", err)
		}
		if values != nil || missing != nil {
			t.Errorf("Fetch failed but returned %d values and %d missing, want nil", len(values), len(missing))
		}
	})

	t.Run("ids", func(t *testing.T) {
		f := fixture(t)
		l, ok := f.Source.(Lister)
		if !ok || f.Listed == nil {
			t.Logf("sourcetest: %T has no IDs listing; nothing to check", f.Source) // a capability, not a skip
			return
		}
		var got []string
		if err := l.IDs(context.Background(), func(id string) error { got = append(got, id); return nil }); err != nil {
			t.Fatalf("IDs: %v", err)
		}
		if !slices.Equal(got, f.Listed) {
			t.Errorf("IDs: got %d ids %q, want %d ids %q", len(got), head(got), len(f.Listed), head(f.Listed))
		}
		stop := errors.New("sourcetest: stop")
		n := 0
		err := l.IDs(context.Background(), func(string) error { n++; return stop })
		if !errors.Is(err, stop) {
			t.Fatalf("IDs with a failing callback: got err %v, want the callback's error", err)
		}
		if n != 1 {
			t.Errorf("IDs called the callback %d times, want 1: it must stop at the first error", n)
		}
	})
}

func fetch(t *testing.T, src Source, ids []string) (map[string][]byte, []string) {
	t.Helper()
	values, missing, err := src.Fetch(context.Background(), ids)
	if err != nil {
		t.Fatalf("Fetch(%d ids): %v", len(ids), err)
	}
	return values, missing
}

func checkPartition(t *testing.T, known map[string][]byte, ids []string, values map[string][]byte, missing []string) {
	t.Helper()
	if err := partitionError(known, ids, values, missing); err != nil {
		t.Error(err)
	}
}

// partitionError checks that every distinct requested id is in exactly one of values and missing, known ids
// with their exact value and unknown ids as missing.
func partitionError(known map[string][]byte, ids []string, values map[string][]byte, missing []string) error {
	var problems []string
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	inMissing := map[string]int{}
	for _, id := range missing {
		inMissing[id]++
	}
	for id := range want {
		v, got := values[id]
		k, isKnown := known[id]
		switch {
		case isKnown && !got:
			problems = append(problems, fmt.Sprintf("id %q: got missing, want value %q", short(id), short(string(k))))
		case isKnown && !bytes.Equal(v, k):
			problems = append(problems, fmt.Sprintf("id %q: got value %q, want %q", short(id), short(string(v)), short(string(k))))
		case !isKnown && got:
			problems = append(problems, fmt.Sprintf("id %q: got value %q, want missing", short(id), short(string(v))))
		case !isKnown && inMissing[id] != 1:
			problems = append(problems, fmt.Sprintf("id %q: listed %d times in missing, want once", short(id), inMissing[id]))
		case isKnown && inMissing[id] != 0:
			problems = append(problems, fmt.Sprintf("id %q: both a value and missing", short(id)))
		case got && v == nil:
			problems = append(problems, fmt.Sprintf("id %q: nil value", short(id)))
		}
	}
	for id := range values {
		if !want[id] {
			problems = append(problems, fmt.Sprintf("value for id %q, which was not requested", short(id)))
		}
	}
	for id := range inMissing {
		if !want[id] {
			problems = append(problems, fmt.Sprintf("missing id %q, which was not requested", short(id)))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	slices.Sort(problems)
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("... and %d more", len(problems)-10))
	}
	return errors.New("sourcetest: " + strings.Join(problems, "\n\t"))
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func unknownIDs(known map[string][]byte, n int) []string {
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("sourcetest-absent-%d", i)
		if _, ok := known[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

func short(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}
