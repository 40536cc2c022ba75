package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"
)

// RedisOptions is c.Redis.Options().
func (c *Config) RedisOptions() (*redis.UniversalOptions, error) { return c.Redis.Options() }

// Options builds go-redis options for redis.NewUniversalClient: a single-node client, a Sentinel failover client
// (MasterName set) or a Cluster client (IsClusterMode), with the ACL username and password, TLS, pool size and
// timeouts. The username and password keys override the URL's. Load has already validated everything, so an
// error means a TLS file changed since.
func (r Redis) Options() (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		ClientName:   "keepwarm",
		DB:           r.DB,
		Username:     r.Username,
		Password:     r.Password.Value(),
		PoolSize:     r.PoolSize,
		DialTimeout:  r.DialTimeout,
		ReadTimeout:  r.ReadTimeout,
		WriteTimeout: r.WriteTimeout,
		Addrs:        r.Addresses,
	}
	var urlUser, urlPass string
	switch r.Mode {
	case ModeSentinel:
		o.MasterName = r.MasterName
		o.SentinelUsername = r.SentinelUsername
		o.SentinelPassword = r.SentinelPassword.Value()
	case ModeCluster:
		o.IsClusterMode = true
		if r.URL != "" {
			co, err := redis.ParseClusterURL(r.URL)
			if err != nil {
				return nil, errors.New("config: redis: url: cannot parse")
			}
			o.Addrs, urlUser, urlPass = co.Addrs, co.Username, co.Password
		}
	default:
		if r.URL != "" {
			so, err := redis.ParseURL(r.URL)
			if err != nil {
				return nil, errors.New("config: redis: url: cannot parse")
			}
			o.Addrs, urlUser, urlPass = []string{so.Addr}, so.Username, so.Password
		}
	}
	if o.Username == "" {
		o.Username = urlUser
	}
	if o.Password == "" {
		o.Password = urlPass
	}
	if r.TLS.Enabled {
		tc, err := r.TLS.Config()
		if err != nil {
			return nil, fmt.Errorf("config: redis.tls: %w", err)
		}
		o.TLSConfig = tc
	}
	return o, nil
}

// Config builds the crypto/tls configuration: TLS 1.2 or later, the CA file's certificates as roots (the
// system's when CAFile is ""), the client certificate when set. Errors name the key at fault.
func (t TLS) Config() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // an explicit, documented opt-in
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return nil, errors.New("cert_file and key_file: set both or neither")
	case t.CertFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file and key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
