package config_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/keepwarm/keepwarm/internal/config"
)

// TestSecretsNeverShown checks every way a config gets printed: Redacted, String, fmt verbs, slog and JSON.
func TestSecretsNeverShown(t *testing.T) {
	const (
		redisPW    = "redis-s3cret-pw"
		urlPW      = "url-s3cret-pw"
		sentinelPW = "sentinel-s3cret"
		dsnPW      = "pg-s3cret-pw"
	)
	secrets := []string{redisPW, urlPW, sentinelPW, dsnPW}
	tests := []struct {
		name string
		text string
		env  []string
	}{
		{"url form", strings.Replace(cfg(nil), "redis://127.0.0.1", "redis://kw:"+urlPW+"@127.0.0.1", 1),
			[]string{"KEEPWARM_REDIS_PASSWORD=" + redisPW, "KEEPWARM_POSTGRES_DSN=postgres://kw:" + dsnPW + "@db:5432/app?sslmode=disable"}},
		{"keyword/value dsn and sentinel", strings.Replace(cfg(map[string]string{"REDIS": "mode = \"sentinel\"\nmaster_name = \"m\"\naddresses = [\"s1:26379\"]\nsentinel_password = \"" + sentinelPW + "\""}),
			`url = "redis://127.0.0.1:16379/0"`, "", 1),
			[]string{"KEEPWARM_REDIS_PASSWORD=" + redisPW, "KEEPWARM_POSTGRES_DSN=host=db user=kw password='" + dsnPW + "' dbname=app"}},
		{"dsn password in the query", cfg(nil),
			[]string{"KEEPWARM_POSTGRES_DSN=postgres://kw@db:5432/app?password=" + dsnPW}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, tt.text, nil, tt.env...)
			var logs bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			logger.Info("config", "redis", c.Redis, "postgres", c.Postgres, "password", c.Redis.Password)
			js, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			outputs := map[string]string{
				"Redacted": c.Redacted(),
				"%v":       fmt.Sprintf("%v", c),
				"%+v":      fmt.Sprintf("%+v", *c),
				"%#v":      fmt.Sprintf("%#v %#v", c.Redis, c.Postgres),
				"%#v cfg":  fmt.Sprintf("%#v", *c),
				"%v redis": fmt.Sprintf("%v %v", c.Redis, c.Postgres),
				"slog":     logs.String(),
				"json":     string(js),
			}
			for how, out := range outputs {
				for _, s := range secrets {
					if strings.Contains(out, s) {
						t.Errorf("%s shows the secret %q:\n%s", how, s, out)
					}
				}
			}
			if !strings.Contains(c.Redacted(), "xxxxx") {
				t.Errorf("Redacted: got no mask:\n%s", c.Redacted())
			}
		})
	}
}

// TestSecretsNotInErrors checks that validation errors about secret values do not quote them.
func TestSecretsNotInErrors(t *testing.T) {
	const pw = "s3cret-in-error"
	for _, env := range [][]string{
		{"KEEPWARM_POSTGRES_DSN=postgres://kw:" + pw + "@db:notaport/app"},
		{"KEEPWARM_POSTGRES_DSN=postgres://kw:" + pw + "@[::1/app"},
		{"KEEPWARM_POSTGRES_DSN=host=db password='" + pw},
		{"KEEPWARM_REDIS_URL=redis://kw:" + pw + "@host:port:x/0"},
		{"KEEPWARM_REDIS_URL=redis://kw:" + pw + "@host:6379/notadb"},
	} {
		_, err := load(t, cfg(nil), nil, env...)
		if err == nil {
			t.Errorf("%s: got no error", env)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: error shows the secret: %v", env, err)
		}
	}
}

func TestSecret(t *testing.T) {
	s := config.Secret("pw")
	if s.Value() != "pw" || s.String() != "xxxxx" || fmt.Sprintf("%v|%s|%#v", s, s, s) != `xxxxx|xxxxx|"xxxxx"` {
		t.Errorf("Secret: got %v %s %#v", s, s, s)
	}
	if config.Secret("").String() != "" {
		t.Errorf("empty Secret: got %q, want empty", config.Secret("").String())
	}
}
