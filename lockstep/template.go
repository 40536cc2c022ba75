package lockstep

import (
	"errors"
	"fmt"
	"strings"
)

// Placeholders a key template may use.
const (
	// PlaceholderID is replaced by the record id, e.g. "42".
	PlaceholderID = "${id}"
	// PlaceholderKey is replaced by the finished cache key, e.g. "product:42". Lock, stale and meta templates use
	// it; the cache key template itself may not.
	PlaceholderKey = "${key}"
)

// Default templates. The defaults put the cache key inside the lock, stale and meta keys, so a Redis Cluster hash
// tag in the cache key ("{product}:${id}") carries over to all of them.
const (
	// DefaultLockTemplate is the lock key's template: "lock:" + the cache key.
	DefaultLockTemplate = "lock:${key}"
	// DefaultStaleTemplate is the usual stale copy's template: "stale:" + the cache key. A keyspace keeps a stale
	// copy only when it names a stale template (this or another).
	DefaultStaleTemplate = "stale:${key}"
	// DefaultMetaTemplate is the meta hash's template: "meta:" + the cache key.
	DefaultMetaTemplate = "meta:${key}"
)

// ErrTemplate is wrapped by every template parse error.
var ErrTemplate = errors.New("lockstep: invalid template")

// Template is a parsed key template: literal text with ${id} and ${key} placeholders, e.g. "track:${id}" or
// "lock:${key}". Any other ${...} is an error; a lone "$" or "{" is literal text, so Redis Cluster hash tags such
// as "{product}:${id}" are free to use. The zero Template is invalid.
type Template struct {
	raw   string
	parts []part
}

type part struct {
	lit string // literal text, when ph == ""
	ph  string // PlaceholderID or PlaceholderKey
}

// ParseTemplate parses s. It returns an error wrapping ErrTemplate when s is empty, holds an unknown or
// unterminated ${...} placeholder, or has no placeholder at all.
func ParseTemplate(s string) (Template, error) {
	if s == "" {
		return Template{}, fmt.Errorf("%w: empty", ErrTemplate)
	}
	t := Template{raw: s}
	rest := s
	for rest != "" {
		i := strings.Index(rest, "${")
		if i < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("%w: %q: unterminated placeholder at byte %d", ErrTemplate, s, len(s)-len(rest)+i)
		}
		ph := rest[i : i+j+1]
		if ph != PlaceholderID && ph != PlaceholderKey {
			return Template{}, fmt.Errorf("%w: %q: unknown placeholder %s (want ${id} or ${key})", ErrTemplate, s, ph)
		}
		t.parts = append(t.parts, part{ph: ph})
		rest = rest[i+j+1:]
	}
	if !t.Has(PlaceholderID) && !t.Has(PlaceholderKey) {
		return Template{}, fmt.Errorf("%w: %q: has no ${id} or ${key} placeholder", ErrTemplate, s)
	}
	return t, nil
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// IsZero reports whether t is the zero Template (no template configured).
func (t Template) IsZero() bool { return t.raw == "" }

// Has reports whether t uses the placeholder ph (PlaceholderID or PlaceholderKey).
func (t Template) Has(ph string) bool {
	for _, p := range t.parts {
		if p.ph == ph {
			return true
		}
	}
	return false
}

// Expand returns t with ${id} replaced by id and ${key} by key. It does no validation.
func (t Template) Expand(id, key string) string {
	var b strings.Builder
	n := 0
	for _, p := range t.parts {
		switch p.ph {
		case "":
			n += len(p.lit)
		case PlaceholderID:
			n += len(id)
		default:
			n += len(key)
		}
	}
	b.Grow(n)
	for _, p := range t.parts {
		switch p.ph {
		case "":
			b.WriteString(p.lit)
		case PlaceholderID:
			b.WriteString(id)
		default:
			b.WriteString(key)
		}
	}
	return b.String()
}

// substituteKey returns t with ${key} replaced by the parts of the cache key template k, so that the result is a
// template over ${id} alone. Used to reason about hash tags.
func (t Template) substituteKey(k Template) []part {
	var out []part
	for _, p := range t.parts {
		if p.ph == PlaceholderKey {
			out = append(out, k.parts...)
			continue
		}
		out = append(out, p)
	}
	return out
}

// hashTagForm returns the Redis Cluster hash tag of parts in symbolic form: the text between the first "{" and
// the next "}" (placeholders rendered as ${id}). ok is false when the first "{" or its "}" could come from a
// placeholder, so that the slot would depend on the id's bytes, or when there is no tag at all.
func hashTagForm(parts []part) (form string, hasID bool, ok bool) {
	var b strings.Builder
	open := false
	for _, p := range parts {
		if p.ph != "" {
			if !open {
				return "", false, false // a placeholder before the first "{": the id could supply the "{"
			}
			b.WriteString(p.ph)
			hasID = true
			continue
		}
		s := p.lit
		if !open {
			i := strings.IndexByte(s, '{')
			if i < 0 {
				continue
			}
			open = true
			s = s[i+1:]
		}
		if j := strings.IndexByte(s, '}'); j >= 0 {
			b.WriteString(s[:j])
			if b.Len() == 0 {
				return "", false, false // "{}" is no tag: Redis hashes the whole key
			}
			return b.String(), hasID, true
		}
		b.WriteString(s)
	}
	return "", false, false
}

// emptyFirstTag reports whether the first "{" of parts, in literal text, is closed at once ("{}product:${id}"):
// Redis then hashes the whole key, as if there were no tag.
func emptyFirstTag(parts []part) bool {
	for _, p := range parts {
		if p.ph != "" {
			return false
		}
		if i := strings.IndexByte(p.lit, '{'); i >= 0 {
			return strings.HasPrefix(p.lit[i+1:], "}")
		}
	}
	return false
}
