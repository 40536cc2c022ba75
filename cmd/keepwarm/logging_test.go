package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keepwarm/keepwarm/internal/config"
)

// TestLoggerWritesDurationsAsStrings: JSON logs printed "ttl":10000000000; they must say "10s".
func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ format, want string }{
		{"json", `"ttl":"10s","group":{"wait":"1.5ms"}`},
		{"text", `ttl=10s group.wait=1.5ms`},
	} {
		t.Run(tt.format, func(t *testing.T) {
			var buf bytes.Buffer
			log := newLogger(config.Daemon{LogFormat: tt.format, LogLevel: slog.LevelInfo}, &buf)
			log.Info("x", "ttl", 10*time.Second, slog.Group("group", "wait", 1500*time.Microsecond))
			if got := buf.String(); !strings.Contains(got, tt.want) {
				t.Errorf("got %s, want it to contain %s", got, tt.want)
			}
		})
	}
}
