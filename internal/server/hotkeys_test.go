package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/server"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestHotkeysEscapesInvalidBytes: GET /debug/hotkeys shows ids with invalid UTF-8 escaped (\xff) and marked
// id_escaped, not as U+FFFD, so two different bad ids stay distinguishable.
func TestHotkeysEscapesInvalidBytes(t *testing.T) {
	status := []warmer.KeyspaceStatus{{Name: "items", Keys: []warmer.KeyStatus{
		{ID: "\xff\xfe1", Key: "item:\xff\xfe1"},
		{ID: "\xff\xfd1", Key: "item:\xff\xfd1"},
		{ID: "7", Key: "item:7"},
	}}}
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry(),
		Hotkeys: func(int) any { return status }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	resp, err := http.Get("http://" + srv.Addr() + "/debug/hotkeys")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), `\ufffd`) || strings.ContainsRune(string(body), 0xFFFD) {
		t.Errorf("body has U+FFFD:\n%s", body)
	}
	var got []struct {
		Keys []struct {
			ID        string `json:"id"`
			Key       string `json:"key"`
			IDEscaped bool   `json:"id_escaped"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id, key string
		escaped bool
	}{{`\xff\xfe1`, `item:\xff\xfe1`, true}, {`\xff\xfd1`, `item:\xff\xfd1`, true}, {"7", "item:7", false}}
	if len(got) != 1 || len(got[0].Keys) != len(want) {
		t.Fatalf("got %s", body)
	}
	for i, w := range want {
		k := got[0].Keys[i]
		if k.ID != w.id || k.Key != w.key || k.IDEscaped != w.escaped {
			t.Errorf("key %d: got id %q key %q id_escaped %v, want %q %q %v", i, k.ID, k.Key, k.IDEscaped, w.id, w.key, w.escaped)
		}
	}
}
