package redisserver_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/redisserver"
	"github.com/keepwarm/keepwarm/internal/testenv"
)

func TestStartAndStop(t *testing.T) {
	ctx := context.Background()
	srv, err := redisserver.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			srv.Stop()
		}
	})
	opt, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatalf("parse %q: %v", srv.URL, err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the private server: %v", err)
	}
	if srv.Process == nil || srv.Process.Pid <= 0 {
		t.Fatalf("Process = %v, want the redis-server process", srv.Process)
	}
	srv.Stop()
	stopped = true
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Stop: got nil error, want the server gone")
	}
}

func TestDeleteContaining(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	p := testenv.Prefix(t, c)
	tests := []struct {
		name       string
		s          string
		keys       []string
		wantKept   []string
		wantGoneOf []string
	}{
		{
			name:       "prefix anywhere in the name",
			s:          p + "a:",
			keys:       []string{p + "a:1", "lock:" + p + "a:1", "stale:" + p + "a:2:x", p + "b:1"},
			wantKept:   []string{p + "b:1"},
			wantGoneOf: []string{p + "a:1", "lock:" + p + "a:1", "stale:" + p + "a:2:x"},
		},
		{
			name:       "glob characters match only themselves",
			s:          p + "g[1]*?:",
			keys:       []string{p + "g[1]*?:x", p + "g1zz:x", p + "g[1]ab:x"},
			wantKept:   []string{p + "g1zz:x", p + "g[1]ab:x"},
			wantGoneOf: []string{p + "g[1]*?:x"},
		},
		{
			name:       "more than one batch",
			s:          p + "many:",
			keys:       manyKeys(p+"many:", 2500),
			wantGoneOf: manyKeys(p+"many:", 2500),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range tt.keys {
				if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := redisserver.DeleteContaining(ctx, c, tt.s); err != nil {
				t.Fatalf("DeleteContaining(%q): %v", tt.s, err)
			}
			for _, k := range tt.wantKept {
				if n, err := c.Exists(ctx, k).Result(); err != nil || n != 1 {
					t.Errorf("EXISTS %q = %d, %v; want 1, nil (it does not contain %q)", k, n, err, tt.s)
				}
			}
			if n, err := c.Exists(ctx, tt.wantGoneOf...).Result(); err != nil || n != 0 {
				t.Errorf("EXISTS of the keys containing %q = %d, %v; want 0, nil", tt.s, n, err)
			}
		})
	}
}

func manyKeys(p string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = p + strconv.Itoa(i)
	}
	return ks
}
