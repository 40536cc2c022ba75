package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestDemoConfigFeeds: the shipped config feeds track, album and chart-genre as the issue describes.
func TestDemoConfigFeeds(t *testing.T) {
	c, err := config.LoadEnv("../../config.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Streamed() {
		t.Fatal("config.toml: the change stream is not enabled")
	}
	got := map[string]string{}
	for _, ks := range c.Keyspaces {
		got[ks.Name] = ks.FeedsString()
	}
	for name, want := range map[string]string{
		"track":       "refresh: track.track_id",
		"album":       "refresh: album.album_id, track.album_id",
		"chart-genre": "refresh: track.genre_id",
		"artist":      "-",
	} {
		if got[name] != want {
			t.Errorf("keyspace %q fed by: got %q, want %q", name, got[name], want)
		}
	}
	if got, want := c.FeedingTables(), []string{"public.track", "public.album"}; !slices.Equal(got, want) {
		t.Errorf("FeedingTables: got %v, want %v", got, want)
	}
}

func TestChangesConfig(t *testing.T) {
	feeds := `on_change = "invalidate"
fed_by = [{ table = "app.track", id = "track_id" }, { table = "album", id = "album_id" }]`
	c := mustLoad(t, cfg(map[string]string{"KEYSPACE": feeds, "REST": "[changes]\nenabled = true\nslot = \"kw_1\""}), nil,
		"KEEPWARM_CHANGES_DSN=postgres://kw:secret@primary:5432/db")
	ks := c.Keyspace("track")
	if ks.OnChange != "invalidate" || len(ks.FedBy) != 2 || ks.FedBy[1] != (config.Feed{Table: "public.album", ID: "album_id"}) {
		t.Errorf("track: got on_change %q fed_by %+v", ks.OnChange, ks.FedBy)
	}
	if c.Changes.Slot != "kw_1" || c.Changes.Publication != "keepwarm" || !c.Changes.CreatePublication {
		t.Errorf("[changes]: got %+v", c.Changes)
	}
	if c.StreamDSN() != "postgres://kw:secret@primary:5432/db" {
		t.Errorf("StreamDSN: got %q, want the KEEPWARM_CHANGES_DSN", c.StreamDSN())
	}
	if s := c.Changes.String(); strings.Contains(s, "secret") {
		t.Errorf("Changes.String() shows the password: %s", s)
	}
	if c.Changes.VisibilityTimeout != warmer.DefaultVisibilityTimeout || c.Changes.Freshness != warmer.DefaultFreshness {
		t.Errorf("visibility_timeout %v, freshness %v: want the defaults", c.Changes.VisibilityTimeout, c.Changes.Freshness)
	}
	// The old name of visibility_timeout is still read, with a note.
	c = mustLoad(t, cfg(map[string]string{"KEYSPACE": feeds, "REST": "[changes]\nenabled = true\nreplay_timeout = \"3s\""}), nil)
	if c.Changes.VisibilityTimeout != 3*time.Second || !slices.ContainsFunc(c.Notes, func(n string) bool { return strings.Contains(n, "replay_timeout is now called visibility_timeout") }) {
		t.Errorf("replay_timeout = 3s: visibility_timeout %v, notes %q", c.Changes.VisibilityTimeout, c.Notes)
	}
}

func TestBadChangesConfigs(t *testing.T) {
	tests := []struct{ name, keyspace, rest, want string }{
		{"unknown on_change", `on_change = "delete"` + "\n" + `fed_by = [{ table = "t", id = "id" }]`, "",
			`keyspace "track": on_change: "delete" is not "refresh" or "invalidate"`},
		{"on_change without fed_by", `on_change = "refresh"`, "", `keyspace "track": on_change: is set but fed_by`},
		{"fed_by without id", `fed_by = [{ table = "t" }]`, "", `keyspace "track": fed_by[0]: id: missing (required)`},
		{"fed_by typo", `fed_by = [{ table = "t", ids = "x" }]`, "", `fed_by[0]: unknown key "ids" (did you mean "id"?)`},
		{"bad table name", `fed_by = [{ table = "Track; drop", id = "id" }]`, "", `fed_by[0]: table: table "Track; drop"`},
		{"twice", `fed_by = [{ table = "t", id = "id" }, { table = "public.t", id = "id" }]`, "", `public.t.id is listed twice`},
		{"enabled with no feed", "", "[changes]\nenabled = true", `changes: enabled: is true but no [[keyspace]] has fed_by`},
		{"bad slot", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nslot = \"Bad-Slot\"", `changes: slot: "Bad-Slot" is not a valid slot name`},
		{"lease too short", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nlease_ttl = \"100ms\"", `changes: lease_ttl: 100ms is not in [1s, 1m]`},
		{"status interval above wal_sender_timeout's half", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nstatus_interval = \"1m\"", `changes: status_interval: 1m0s is not in [100ms, 30s]`},
		{"status interval zero", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nstatus_interval = \"0s\"", `changes: status_interval: must be more than 0`},
		{"visibility timeout too long", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nvisibility_timeout = \"2m\"", `changes: visibility_timeout: 2m0s is not in (0, 1m]`},
		{"old and new name", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nvisibility_timeout = \"5s\"\nreplay_timeout = \"2s\"", `changes: replay_timeout: is the old name of visibility_timeout`},
		{"freshness too short", `fed_by = [{ table = "t", id = "id" }]`, "[changes]\nenabled = true\nfreshness = \"10ms\"", `changes: freshness: 10ms is not in [100ms, 1m]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, cfg(map[string]string{"KEYSPACE": tt.keyspace, "REST": tt.rest}), nil)
			var ve *config.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a ValidationError", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %q, want it to contain %q", err, tt.want)
			}
		})
	}
}
