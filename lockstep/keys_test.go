package lockstep_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/lockstep"
)

func TestNewKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		cache, lock, stale, mta string
		wantErr                 []string // substrings; nil = valid
		want                    lockstep.KeySet
	}{
		{
			name: "defaults", cache: "product:${id}",
			want: lockstep.KeySet{ID: "42", Cache: "product:42", Lock: "lock:product:42", Meta: "meta:product:42"},
		},
		{
			name: "stale", cache: "product:${id}", stale: lockstep.DefaultStaleTemplate,
			want: lockstep.KeySet{ID: "42", Cache: "product:42", Lock: "lock:product:42", Stale: "stale:product:42", Meta: "meta:product:42"},
		},
		{
			name: "custom", cache: "p:${id}", lock: "p:${id}:lock", stale: "p:${id}:old", mta: "p:${id}:meta",
			want: lockstep.KeySet{ID: "42", Cache: "p:42", Lock: "p:42:lock", Stale: "p:42:old", Meta: "p:42:meta"},
		},
		{
			name: "hash tag", cache: "{product}:${id}", stale: lockstep.DefaultStaleTemplate,
			want: lockstep.KeySet{ID: "42", Cache: "{product}:42", Lock: "lock:{product}:42", Stale: "stale:{product}:42", Meta: "meta:{product}:42"},
		},
		{name: "cache without id", cache: "product", wantErr: []string{"key template", "no ${id} or ${key}"}},
		{name: "cache with key", cache: "p:${key}", wantErr: []string{"key template", "${key} is the cache key itself"}},
		{name: "empty cache", cache: "", wantErr: []string{"key template", "empty"}},
		{name: "bad lock", cache: "p:${id}", lock: "lock", wantErr: []string{"lock template"}},
		{name: "bad stale", cache: "p:${id}", stale: "${nope}", wantErr: []string{"stale template", "unknown placeholder"}},
		{name: "bad meta", cache: "p:${id}", mta: "meta:${key", wantErr: []string{"meta template", "unterminated"}},
		{name: "all errors together", cache: "p", lock: "l", wantErr: []string{"key template", "lock template"}},
		{name: "lock equals cache", cache: "p:${id}", lock: "${key}", wantErr: []string{"lock template", "same key as the key template"}},
		{name: "meta equals lock", cache: "p:${id}", lock: "x:${id}", mta: "x:${id}", wantErr: []string{"meta template", "same key as the lock template"}},
		{name: "stale equals meta", cache: "p:${id}", stale: "meta:${key}", wantErr: []string{"stale template", "same key as the meta template"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := lockstep.NewKeys(tt.cache, tt.lock, tt.stale, tt.mta)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("NewKeys = %+v, want an error", k)
				}
				if !errors.Is(err, lockstep.ErrTemplate) {
					t.Errorf("error %v does not wrap ErrTemplate", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error = %q, want it to contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("NewKeys: %v", err)
			}
			got, err := k.For("42")
			if err != nil {
				t.Fatalf("For(42): %v", err)
			}
			if got != tt.want {
				t.Errorf("For(42) = %+v, want %+v", got, tt.want)
			}
			if key, err := k.CacheKey("42"); err != nil || key != tt.want.Cache {
				t.Errorf("CacheKey(42) = %q, %v; want %q", key, err, tt.want.Cache)
			}
		})
	}
}

func TestKeysCheckCluster(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		cache, lock, stale, mta string
		wantErr                 string // "" = accepted
	}{
		{name: "tag with defaults", cache: "{product}:${id}", stale: lockstep.DefaultStaleTemplate},
		{name: "tag per id", cache: "product:{${id}}", stale: lockstep.DefaultStaleTemplate},
		{name: "tag per id with literal", cache: "product:{p${id}}"},
		{name: "custom templates with same tag", cache: "{p}:${id}", lock: "{p}:lock:${id}", mta: "{p}:meta:${id}"},
		{name: "no tag", cache: "product:${id}", wantErr: `key template "product:${id}": no fixed Redis Cluster hash tag`},
		{name: "id before tag", cache: "${id}:{product}", wantErr: "no fixed Redis Cluster hash tag"},
		{name: "empty tag", cache: "{}:${id}", wantErr: `key template "{}:${id}": no fixed Redis Cluster hash tag: its first "{...}" is empty`},
		{name: "empty tag before a name", cache: "{}product:${id}", wantErr: `its first "{...}" is empty ("{}"), so Redis hashes the whole key`},
		{name: "lock with other tag", cache: "{p}:${id}", lock: "{locks}:${id}", wantErr: `lock template "{locks}:${id}": hash tag {locks} differs`},
		{name: "meta without tag", cache: "{p}:${id}", mta: "meta:${id}", wantErr: `meta template "meta:${id}": no fixed`},
		{name: "stale with other tag", cache: "{p}:${id}", stale: "{s}:${key}", wantErr: "stale template"},
		{name: "unterminated tag", cache: "{p:${id}", wantErr: "no fixed Redis Cluster hash tag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := lockstep.NewKeys(tt.cache, tt.lock, tt.stale, tt.mta)
			if err != nil {
				t.Fatalf("NewKeys: %v", err)
			}
			err = k.CheckCluster()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckCluster: %v, want nil", err)
				}
				// Accepted: all keys of some awkward ids share one slot.
				for _, id := range []string{"1", "42", "a{b}c", "x}y", "{", "}{", "ümlaut"} {
					ks, err := k.For(id)
					if err != nil {
						continue
					}
					for _, key := range []string{ks.Lock, ks.Meta, ks.Stale} {
						if key != "" && hashSlot(key) != hashSlot(ks.Cache) {
							t.Errorf("id %q: %q in slot %d, %q in slot %d", id, ks.Cache, hashSlot(ks.Cache), key, hashSlot(key))
						}
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("CheckCluster = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestKeysForRejectsIDThatEmptiesTheTag(t *testing.T) {
	t.Parallel()
	for _, cache := range []string{"product:{${id}}", "product:{${id}:x}"} {
		k, err := lockstep.NewKeys(cache, "", "", "")
		if err != nil {
			t.Fatalf("NewKeys(%q): %v", cache, err)
		}
		if _, err := k.For("}7"); !errors.Is(err, lockstep.ErrInvalidID) {
			t.Errorf("%q: For(\"}7\") error = %v, want ErrInvalidID", cache, err)
		}
		if _, err := k.CacheKey("}7"); !errors.Is(err, lockstep.ErrInvalidID) {
			t.Errorf("%q: CacheKey(\"}7\") error = %v, want ErrInvalidID", cache, err)
		}
		if _, err := k.For("7}"); err != nil {
			t.Errorf("%q: For(\"7}\") = %v, want nil", cache, err)
		}
	}
}

func TestValidateID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		id      string
		wantErr string
	}{
		{name: "digits", id: "42"},
		{name: "spaces and quotes", id: `a "b" 'c'`},
		{name: "braces", id: "{x}"},
		{name: "max length", id: strings.Repeat("x", lockstep.MaxIDBytes)},
		{name: "empty", id: "", wantErr: "empty"},
		{name: "too long", id: strings.Repeat("x", lockstep.MaxIDBytes+1), wantErr: "more than 4096"},
		{name: "bad utf8", id: "a\xffb", wantErr: "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := lockstep.ValidateID(tt.id)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateID: %v", err)
				}
				return
			}
			if !errors.Is(err, lockstep.ErrInvalidID) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateID = %v, want ErrInvalidID containing %q", err, tt.wantErr)
			}
		})
	}
}

// hashSlot is Redis Cluster's key → slot function: CRC16-XMODEM of the hash tag (the text between the first "{"
// and the next "}", when not empty) or of the whole key, mod 16384.
func hashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func TestHashSlot(t *testing.T) {
	t.Parallel()
	// Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
	for key, want := range map[string]int{"123456789": 0x31C3 % 16384, "foo": 12182, "{user1000}.following": hashSlot("user1000")} {
		if got := hashSlot(key); got != want {
			t.Errorf("hashSlot(%q) = %d, want %d", key, got, want)
		}
	}
}
