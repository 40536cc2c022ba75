package config_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/internal/testenv"
)

// TestRedisOptionsACL connects to the real Redis as an ACL user whose password comes from the environment.
func TestRedisOptionsACL(t *testing.T) {
	admin := testenv.Redis(t)
	ctx := context.Background()
	user := fmt.Sprintf("kwtest-config-%d", time.Now().UnixNano())
	const pw = "acl-test-pw"
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pw, "~kwtest:*", "+@connection", "+set", "+get").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })

	text := cfg(map[string]string{"REDIS": `username = "` + user + `"`})
	for _, tt := range []struct {
		name    string
		env     []string
		wantErr bool
	}{
		{"password from the environment", []string{"KEEPWARM_REDIS_URL=" + testenv.RedisURL(), "KEEPWARM_REDIS_PASSWORD=" + pw}, false},
		{"wrong password", []string{"KEEPWARM_REDIS_URL=" + testenv.RedisURL(), "KEEPWARM_REDIS_PASSWORD=nope"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, text, nil, tt.env...)
			opts, err := c.RedisOptions()
			if err != nil {
				t.Fatal(err)
			}
			if opts.Username != user || opts.ClientName != "keepwarm" || opts.DialTimeout != 5*time.Second {
				t.Errorf("options: got user %q, client name %q, dial timeout %s", opts.Username, opts.ClientName, opts.DialTimeout)
			}
			client := redis.NewUniversalClient(opts)
			defer client.Close()
			if _, isSingle := client.(*redis.Client); !isSingle {
				t.Errorf("NewUniversalClient: got %T, want *redis.Client in single mode", client)
			}
			err = client.Ping(ctx).Err()
			if tt.wantErr != (err != nil) {
				t.Fatalf("Ping: got %v, want error: %t", err, tt.wantErr)
			}
			if !tt.wantErr {
				if err := client.Set(ctx, "kwtest:config:acl:"+user, "v", time.Minute).Err(); err != nil {
					t.Errorf("SET as %s: %v", user, err)
				}
				admin.Del(ctx, "kwtest:config:acl:"+user)
			}
		})
	}
}

func TestRedisOptionsModes(t *testing.T) {
	noURL := func(s string) string { return strings.Replace(s, `url = "redis://127.0.0.1:16379/0"`, "", 1) }
	t.Run("sentinel", func(t *testing.T) {
		c := mustLoad(t, noURL(cfg(map[string]string{"REDIS": "mode = \"sentinel\"\nmaster_name = \"main\"\naddresses = [\"s1:26379\", \"s2:26379\"]\nsentinel_password = \"sp\"\npassword = \"mp\""})), nil)
		o, err := c.RedisOptions()
		if err != nil {
			t.Fatal(err)
		}
		if o.MasterName != "main" || len(o.Addrs) != 2 || o.SentinelPassword != "sp" || o.Password != "mp" {
			t.Errorf("sentinel options: got %+v", o)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := mustLoad(t, strings.Replace(noURL(cfg(map[string]string{
			"REDIS": "mode = \"cluster\"\naddresses = [\"n1:6379\"]\npool_size = 7\nread_timeout = \"1s\"",
		})), `key = "track:${id}"`, `key = "{track}:${id}"`, 1), nil)
		o, err := c.RedisOptions()
		if err != nil {
			t.Fatal(err)
		}
		if !o.IsClusterMode || o.PoolSize != 7 || o.ReadTimeout != time.Second || o.Addrs[0] != "n1:6379" {
			t.Errorf("cluster options: got %+v", o)
		}
	})
	t.Run("rediss url", func(t *testing.T) {
		c := mustLoad(t, strings.Replace(cfg(nil), "redis://127.0.0.1:16379/0", "rediss://u:p@cache.internal:6380/4", 1), nil)
		o, err := c.RedisOptions()
		if err != nil {
			t.Fatal(err)
		}
		if o.TLSConfig == nil || o.Addrs[0] != "cache.internal:6380" || o.DB != 4 || o.Username != "u" || o.Password != "p" {
			t.Errorf("rediss options: got %+v", o)
		}
	})
}

func TestRedisOptionsTLS(t *testing.T) {
	caPEM, certPEM, keyPEM := certs(t)
	text := cfg(map[string]string{"REST": `
[redis.tls]
enabled = true
ca_file = "tls/ca.pem"
cert_file = "tls/client.pem"
key_file = "tls/client-key.pem"
server_name = "redis.internal"
`})
	c := mustLoad(t, text, map[string]string{"tls/ca.pem": caPEM, "tls/client.pem": certPEM, "tls/client-key.pem": keyPEM})
	o, err := c.RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	tc := o.TLSConfig
	if tc == nil || tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "redis.internal" || tc.InsecureSkipVerify {
		t.Fatalf("TLS config: got %+v", tc)
	}
	// A CA file that holds no certificate, and a key without its certificate, are config errors.
	for name, files := range map[string]map[string]string{
		"ca_file: ":                {"tls/ca.pem": "not pem", "tls/client.pem": certPEM, "tls/client-key.pem": keyPEM},
		"cert_file and key_file: ": {"tls/ca.pem": caPEM, "tls/client.pem": keyPEM, "tls/client-key.pem": keyPEM},
	} {
		if _, err := load(t, text, files); err == nil || !strings.Contains(err.Error(), "redis.tls: "+name) {
			t.Errorf("got %v, want an error naming redis.tls %s", err, name)
		}
	}
}

// certs returns a self-signed CA and a client certificate and key it signed, in PEM.
func certs(t *testing.T) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kwtest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	clientTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "keepwarm"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, clientTmpl, caTmpl, &clientKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return enc("CERTIFICATE", caDER), enc("CERTIFICATE", clientDER), enc("EC PRIVATE KEY", keyDER)
}
