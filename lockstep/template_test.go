package lockstep_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/lockstep"
)

func TestParseTemplate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		wantErr string // substring of the error; "" = valid
		hasID   bool
		hasKey  bool
		expand  string // Expand("42", "product:42")
	}{
		{name: "id", in: "product:${id}", hasID: true, expand: "product:42"},
		{name: "key", in: "lock:${key}", hasKey: true, expand: "lock:product:42"},
		{name: "both", in: "${key}|${id}", hasID: true, hasKey: true, expand: "product:42|42"},
		{name: "only placeholder", in: "${id}", hasID: true, expand: "42"},
		{name: "repeated", in: "${id}-${id}", hasID: true, expand: "42-42"},
		{name: "hash tag", in: "{product}:${id}", hasID: true, expand: "{product}:42"},
		{name: "tag around id", in: "product:{${id}}", hasID: true, expand: "product:{42}"},
		{name: "lone dollar", in: "a$b:${id}", hasID: true, expand: "a$b:42"},
		{name: "dollar before placeholder", in: "$${id}", hasID: true, expand: "$42"},
		{name: "braces", in: "{}{:${id}}", hasID: true, expand: "{}{:42}"},
		{name: "unicode", in: "produit·${id}", hasID: true, expand: "produit·42"},
		{name: "empty", in: "", wantErr: "empty"},
		{name: "no placeholder", in: "product", wantErr: "no ${id} or ${key}"},
		{name: "unknown placeholder", in: "product:${ID}", wantErr: "unknown placeholder ${ID}"},
		{name: "unknown name", in: "${keyspace}:${id}", wantErr: "unknown placeholder ${keyspace}"},
		{name: "unterminated", in: "product:${id", wantErr: "unterminated placeholder at byte 8"},
		{name: "nested", in: "${${id}}", wantErr: "unknown placeholder"},
		{name: "empty placeholder", in: "a${}${id}", wantErr: "unknown placeholder ${}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tpl, err := lockstep.ParseTemplate(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseTemplate(%q) = %q, want an error containing %q", tt.in, tpl, tt.wantErr)
				}
				if !errors.Is(err, lockstep.ErrTemplate) {
					t.Errorf("error %v does not wrap ErrTemplate", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error = %q, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTemplate(%q): %v", tt.in, err)
			}
			if got := tpl.String(); got != tt.in {
				t.Errorf("String() = %q, want %q", got, tt.in)
			}
			if tpl.IsZero() {
				t.Errorf("IsZero() = true for a parsed template")
			}
			if got := tpl.Has(lockstep.PlaceholderID); got != tt.hasID {
				t.Errorf("Has(${id}) = %v, want %v", got, tt.hasID)
			}
			if got := tpl.Has(lockstep.PlaceholderKey); got != tt.hasKey {
				t.Errorf("Has(${key}) = %v, want %v", got, tt.hasKey)
			}
			if got := tpl.Expand("42", "product:42"); got != tt.expand {
				t.Errorf("Expand = %q, want %q", got, tt.expand)
			}
		})
	}
}

func TestTemplateZero(t *testing.T) {
	t.Parallel()
	var z lockstep.Template
	if !z.IsZero() {
		t.Errorf("zero Template: IsZero() = false, want true")
	}
	if got := z.Expand("1", "k"); got != "" {
		t.Errorf("zero Template: Expand = %q, want \"\"", got)
	}
}

// FuzzParseTemplate checks, for any template text and id, that parsing never panics, that a parsed template
// round-trips and expands exactly like plain text substitution, and that the key layout built on it gives
// distinct keys that share one Redis Cluster slot whenever CheckCluster accepts it. Its seeds run in every
// `go test`; fuzz with `go test -run '^$' -fuzz FuzzParseTemplate ./lockstep`.
func FuzzParseTemplate(f *testing.F) {
	for _, seed := range []struct{ tpl, id string }{
		{"product:${id}", "42"},
		{"{product}:${id}", "42"},
		{"{product}:${id}", "}x"},
		{"product:{${id}}", "}x"},
		{"product:{${id}:x}", "}"},
		{"{${id}}", "a}b"},
		{"${id}{tag}", "{x}"},
		{"lock:${key}", "1"},
		{"${key}|${id}", "1"},
		{"a$b:${id}", "$"},
		{"${id", "1"},
		{"${${id}}", "1"},
		{"", ""},
		{"{}:${id}", "7"},
		{"x{${id}", "{}"},
		{"é${id}", "\xff"},
	} {
		f.Add(seed.tpl, seed.id)
	}
	f.Fuzz(func(t *testing.T, s, id string) {
		tpl, err := lockstep.ParseTemplate(s)
		if err != nil {
			if !errors.Is(err, lockstep.ErrTemplate) {
				t.Fatalf("ParseTemplate(%q) error %v does not wrap ErrTemplate", s, err)
			}
			return
		}
		if tpl.String() != s {
			t.Fatalf("String() = %q, want %q", tpl.String(), s)
		}
		want := strings.NewReplacer(lockstep.PlaceholderID, id, lockstep.PlaceholderKey, "K").Replace(s)
		if got := tpl.Expand(id, "K"); got != want {
			t.Fatalf("ParseTemplate(%q).Expand(%q, K) = %q, want %q", s, id, got, want)
		}

		keys, err := lockstep.NewKeys(s, "", lockstep.DefaultStaleTemplate, "")
		if err != nil {
			if !errors.Is(err, lockstep.ErrTemplate) {
				t.Fatalf("NewKeys(%q) error %v does not wrap ErrTemplate", s, err)
			}
			return
		}
		ks, err := keys.For(id)
		if err != nil {
			if !errors.Is(err, lockstep.ErrInvalidID) {
				t.Fatalf("For(%q) error %v does not wrap ErrInvalidID", id, err)
			}
			return
		}
		all := []string{ks.Cache, ks.Lock, ks.Stale, ks.Meta}
		for i := range all {
			for j := i + 1; j < len(all); j++ {
				if all[i] == all[j] {
					t.Fatalf("template %q id %q: two keys are both %q", s, id, all[i])
				}
			}
		}
		if keys.CheckCluster() == nil {
			slot := hashSlot(ks.Cache)
			for _, k := range all[1:] {
				if got := hashSlot(k); got != slot {
					t.Fatalf("template %q id %q: CheckCluster accepted it but %q is in slot %d and %q in slot %d",
						s, id, ks.Cache, slot, k, got)
				}
			}
		}
	})
}
