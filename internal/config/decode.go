package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// decoder turns the raw map that koanf produced into typed values, collecting every problem with the path of
// its field. Getters mark keys as known; table.done reports the rest as unknown, so a typo is never ignored.
type decoder struct {
	problems []string
	notes    []string          // facts worth telling that are not problems: which source of a setting won
	fromEnv  map[string]string // koanf path ("redis.password") -> the environment variable that set it
	// known, when non-nil, records the koanf path and kind of every scalar key asked for in a non-array table:
	// the keys that an environment variable may set.
	known map[string]kind
}

type kind int

const (
	kindScalar kind = iota
	kindList
	kindTable
)

func (d *decoder) addf(format string, args ...any) {
	d.problems = append(d.problems, fmt.Sprintf(format, args...))
}

// table is one TOML table being decoded.
type table struct {
	d     *decoder
	label string // how messages name the table: "redis", "redis.tls", `keyspace "track"`
	path  string // koanf path of the table ("redis.tls"); "" inside arrays, which the environment cannot reach
	m     map[string]any
	asked []string
}

func newTable(d *decoder, label, path string, m map[string]any) *table {
	if m == nil {
		m = map[string]any{}
	}
	return &table{d: d, label: label, path: path, m: m}
}

// field returns how a message names key: `ttl`, or `password (from KEEPWARM_REDIS_PASSWORD)`.
func (t *table) field(key string) string {
	if t.path != "" {
		if env, ok := t.d.fromEnv[t.path+"."+key]; ok {
			return key + " (from " + env + ")"
		}
	}
	return key
}

// problem records a problem about key: `keyspace "track": ttl: "5x" is not a duration`.
func (t *table) problem(key, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	switch {
	case t.label == "" && key == "":
		t.d.addf("%s", msg)
	case t.label == "":
		t.d.addf("%s: %s", t.field(key), msg)
	case key == "":
		t.d.addf("%s: %s", t.label, msg)
	default:
		t.d.addf("%s: %s: %s", t.label, t.field(key), msg)
	}
}

func (t *table) get(key string, k kind) (any, bool) {
	t.asked = append(t.asked, key)
	if t.d.known != nil && t.path != "" {
		t.d.known[t.path+"."+key] = k
	}
	v, ok := t.m[key]
	return v, ok
}

// done reports every key of the table that no getter asked for.
func (t *table) done() {
	var unknown []string
	for k := range t.m {
		if !slices.Contains(t.asked, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		what := "unknown key"
		if t.label == "" {
			what = "unknown section"
		}
		if s := suggest(k, t.asked); s != "" {
			t.problem("", "%s %q (did you mean %q?)", what, k, s)
		} else {
			t.problem("", "%s %q (known: %s)", what, k, strings.Join(t.asked, ", "))
		}
	}
}

// has reports whether key is present, valid or not: "missing" checks use it so that a bad value is not also
// reported as missing.
func (t *table) has(key string) bool {
	_, ok := t.m[key]
	return ok
}

// describe names a TOML value's type for messages.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %g", v)
	case bool:
		return fmt.Sprintf("boolean %t", v)
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	default:
		return fmt.Sprintf("%T %v", v, v)
	}
}

func (t *table) str(key string, dst *string) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	s, isStr := v.(string)
	if !isStr {
		t.problem(key, "want a string, got %s", describe(v))
		return false
	}
	*dst = s
	return true
}

// secret is str without echoing the value in messages.
func (t *table) secret(key string, dst *Secret) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	s, isStr := v.(string)
	if !isStr {
		t.problem(key, "want a string")
		return false
	}
	*dst = Secret(s)
	return true
}

func (t *table) strs(key string, dst *[]string) bool {
	v, ok := t.get(key, kindList)
	if !ok {
		return false
	}
	arr, isArr := v.([]any)
	if !isArr {
		t.problem(key, "want an array of strings, got %s", describe(v))
		return false
	}
	out := make([]string, 0, len(arr))
	good := true
	for i, e := range arr {
		s, isStr := e.(string)
		if !isStr {
			t.problem(fmt.Sprintf("%s[%d]", key, i), "want a string, got %s", describe(e))
			good = false
			continue
		}
		out = append(out, s)
	}
	if good {
		*dst = out
	}
	return good
}

func (t *table) integer(key string, dst *int) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	switch v := v.(type) {
	case int64:
		if v < math.MinInt32 || v > math.MaxInt32 {
			t.problem(key, "%d is out of range", v)
			return false
		}
		*dst = int(v)
		return true
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < math.MinInt32 || n > math.MaxInt32 {
			t.problem(key, "%q is not an integer", v)
			return false
		}
		*dst = n
		return true
	}
	t.problem(key, "want an integer, got %s", describe(v))
	return false
}

func (t *table) float(key string, dst *float64) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	switch v := v.(type) {
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) { // TOML's bare nan and inf
			t.problem(key, "%v is not a finite number", v)
			return false
		}
		*dst = v
		return true
	case int64:
		*dst = float64(v)
		return true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			t.problem(key, "%q is not a number", v)
			return false
		}
		*dst = f
		return true
	}
	t.problem(key, "want a number, got %s", describe(v))
	return false
}

func (t *table) boolean(key string, dst *bool) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	switch v := v.(type) {
	case bool:
		*dst = v
		return true
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			t.problem(key, "%q is not a boolean (true or false)", v)
			return false
		}
		*dst = b
		return true
	}
	t.problem(key, "want true or false, got %s", describe(v))
	return false
}

// duration reads a Go duration string ("30s", "1m30s"); it must be in (0, warmer.MaxDuration].
func (t *table) duration(key string, dst *time.Duration) bool {
	v, ok := t.get(key, kindScalar)
	if !ok {
		return false
	}
	switch v := v.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			t.problem(key, "%q is not a duration (write a number with a unit: \"500ms\", \"30s\", \"5m\", \"1h\")", v)
			return false
		}
		if d <= 0 {
			t.problem(key, "must be more than 0, got %q", v)
			return false
		}
		if d > warmer.MaxDuration {
			t.problem(key, "%q is above the limit of %v (one year)", v, warmer.MaxDuration)
			return false
		}
		*dst = d
		return true
	case int64, float64:
		t.problem(key, "%v is not a duration: write it as a string with a unit, e.g. \"%vs\"", v, v)
		return false
	}
	t.problem(key, "want a duration string such as \"30s\", got %s", describe(v))
	return false
}

// sub returns the nested table key; an absent one is empty, so that its getters still record the known keys.
func (t *table) sub(key string) *table {
	v, ok := t.get(key, kindTable)
	label := key
	if t.label != "" {
		label = t.label + "." + key
	}
	path := ""
	if t.path != "" {
		path = t.path + "." + key
	} else if t.label == "" {
		path = key
	}
	if !ok {
		return newTable(t.d, label, path, nil)
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		t.problem(key, "want a table ([%s]), got %s", label, describe(v))
		return newTable(t.d, label, path, nil)
	}
	return newTable(t.d, label, path, m)
}

// array returns the tables of an array of tables ([[key]]).
func (t *table) array(key string) []map[string]any {
	v, ok := t.get(key, kindTable)
	if !ok {
		return nil
	}
	arr, isArr := v.([]any)
	if !isArr {
		t.problem(key, "want an array of tables ([[%s]]), got %s", key, describe(v))
		return nil
	}
	out := make([]map[string]any, 0, len(arr))
	for i, e := range arr {
		m, isMap := e.(map[string]any)
		if !isMap {
			t.problem(key, "element %d: want a table, got %s", i+1, describe(e))
			continue
		}
		out = append(out, m)
	}
	return out
}

// suggest returns the known key closest to k when it is a likely typo.
func suggest(k string, known []string) string {
	best, bestD := "", 3
	for _, c := range known {
		if d := editDistance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
