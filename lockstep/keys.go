package lockstep

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalidID is wrapped by every id validation error.
var ErrInvalidID = errors.New("lockstep: invalid id")

// MaxIDBytes is the longest id accepted, in bytes.
const MaxIDBytes = 4096

// Keys is one keyspace's key layout: the templates of the cache key, its lock, its optional stale copy, and the
// metadata hash that lockstep keeps beside the value (write time and rebuild duration, used by XFetch). Build it
// with NewKeys; it is immutable and safe for concurrent use.
type Keys struct {
	Cache Template // e.g. "product:${id}"; must use ${id}, may not use ${key}
	Lock  Template // default DefaultLockTemplate
	Stale Template // zero when the keyspace keeps no stale copy
	Meta  Template // default DefaultMetaTemplate

	clusterTag string // non-empty when every template shares a constant hash tag
	tagHasID   bool   // the shared hash tag contains ${id}
}

// KeySet holds the Redis keys of one id.
type KeySet struct {
	ID    string
	Cache string
	Lock  string
	Stale string // "" when the keyspace keeps no stale copy
	Meta  string
}

// NewKeys parses the templates of one keyspace. lock and meta default to DefaultLockTemplate and
// DefaultMetaTemplate when empty; stale "" means no stale copy. Every template must resolve to something that
// depends on the id: the cache template must use ${id}, the others ${id} or ${key}. Errors wrap ErrTemplate and
// name the template ("lock template: ...").
func NewKeys(cache, lock, stale, meta string) (*Keys, error) {
	if lock == "" {
		lock = DefaultLockTemplate
	}
	if meta == "" {
		meta = DefaultMetaTemplate
	}
	k := &Keys{}
	var errs []error
	var err error
	if k.Cache, err = ParseTemplate(cache); err != nil {
		errs = append(errs, fmt.Errorf("key template: %w", err))
	} else {
		if k.Cache.Has(PlaceholderKey) {
			errs = append(errs, fmt.Errorf("key template: %w: %q: ${key} is the cache key itself; use ${id}", ErrTemplate, cache))
		}
		if !k.Cache.Has(PlaceholderID) {
			errs = append(errs, fmt.Errorf("key template: %w: %q: must contain ${id}", ErrTemplate, cache))
		}
	}
	if k.Lock, err = ParseTemplate(lock); err != nil {
		errs = append(errs, fmt.Errorf("lock template: %w", err))
	}
	if stale != "" {
		if k.Stale, err = ParseTemplate(stale); err != nil {
			errs = append(errs, fmt.Errorf("stale template: %w", err))
		}
	}
	if k.Meta, err = ParseTemplate(meta); err != nil {
		errs = append(errs, fmt.Errorf("meta template: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// The derived keys must differ from the cache key and from each other for every id.
	seen := map[string]string{"key": cache}
	for _, named := range k.named()[1:] {
		sym := render(named.t.substituteKey(k.Cache))
		for other, otherSym := range seen {
			if sym == otherSym {
				return nil, fmt.Errorf("%s template: %w: %q resolves to the same key as the %s template", named.name, ErrTemplate, named.t.raw, other)
			}
		}
		seen[named.name] = sym
	}
	k.clusterTag, k.tagHasID = k.sharedTag()
	return k, nil
}

type namedTemplate struct {
	name string
	t    Template
}

func (k *Keys) named() []namedTemplate {
	out := []namedTemplate{{"key", k.Cache}, {"lock", k.Lock}, {"meta", k.Meta}}
	if !k.Stale.IsZero() {
		out = append(out, namedTemplate{"stale", k.Stale})
	}
	return out
}

func render(parts []part) string {
	var b strings.Builder
	for _, p := range parts {
		if p.ph != "" {
			b.WriteString(p.ph)
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

func (k *Keys) sharedTag() (string, bool) {
	var tag string
	var hasID bool
	for i, n := range k.named() {
		form, h, ok := hashTagForm(n.t.substituteKey(k.Cache))
		if !ok {
			return "", false
		}
		if i == 0 {
			tag, hasID = form, h
		} else if form != tag {
			return "", false
		}
	}
	return tag, hasID
}

// CheckCluster reports whether all of one id's keys are sure to hash to one Redis Cluster slot, whatever the id.
// That holds when every template, with ${key} expanded, starts its first "{...}" hash tag in literal text and all
// the tags are the same (e.g. "{product}:${id}" with the default "lock:${key}"). The error names the template
// that breaks the rule; call it at start-up in cluster mode so that a CROSSSLOT error can never happen later.
func (k *Keys) CheckCluster() error {
	if k.clusterTag != "" {
		return nil
	}
	ref, _, refOK := hashTagForm(k.Cache.parts)
	for _, n := range k.named() {
		form, _, ok := hashTagForm(n.t.substituteKey(k.Cache))
		switch {
		case !ok && emptyFirstTag(n.t.substituteKey(k.Cache)):
			return fmt.Errorf("%s template %q: no fixed Redis Cluster hash tag: its first \"{...}\" is empty (\"{}\"), so Redis hashes the whole key; put a name inside it, e.g. \"{product}:\"", n.name, n.t.raw)
		case !ok:
			return fmt.Errorf("%s template %q: no fixed Redis Cluster hash tag: start the key with a literal tag such as \"{name}:\" so all of one id's keys share a slot", n.name, n.t.raw)
		case !refOK || form != ref:
			return fmt.Errorf("%s template %q: hash tag {%s} differs from the key template's", n.name, n.t.raw, form)
		}
	}
	return nil
}

// For returns the keys of id. It returns an error wrapping ErrInvalidID when id is empty, longer than
// MaxIDBytes, not valid UTF-8, or (with a hash tag made of the id) would leave the tag empty.
func (k *Keys) For(id string) (KeySet, error) {
	if err := k.checkID(id); err != nil {
		return KeySet{}, err
	}
	cache := k.Cache.Expand(id, "")
	ks := KeySet{ID: id, Cache: cache, Lock: k.Lock.Expand(id, cache), Meta: k.Meta.Expand(id, cache)}
	if !k.Stale.IsZero() {
		ks.Stale = k.Stale.Expand(id, cache)
	}
	return ks, nil
}

// CacheKey returns the cache key of id alone, without building the other keys (the read path's common case).
// Errors are those of For.
func (k *Keys) CacheKey(id string) (string, error) {
	if err := k.checkID(id); err != nil {
		return "", err
	}
	return k.Cache.Expand(id, ""), nil
}

// ValidateID returns the error For would return for id, without building a key: an error wrapping ErrInvalidID
// when id is empty, longer than MaxIDBytes, not valid UTF-8, or (with a hash tag made of the id) would leave the
// tag empty; nil otherwise. It allocates nothing for a valid id, so callers can screen many ids cheaply.
func (k *Keys) ValidateID(id string) error { return k.checkID(id) }

func (k *Keys) checkID(id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	if k.tagHasID && strings.HasPrefix(k.clusterTag, PlaceholderID) && strings.HasPrefix(id, "}") {
		return fmt.Errorf("%w: %q: starts with \"}\", which would empty the key's hash tag", ErrInvalidID, id)
	}
	return nil
}

// ValidateID returns an error wrapping ErrInvalidID when id is empty, longer than MaxIDBytes or not valid UTF-8.
// Any other bytes (quotes, spaces, braces) are allowed: ids are never spliced into SQL or scripts.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > MaxIDBytes:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidID, len(id), MaxIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidID, id)
	}
	return nil
}
