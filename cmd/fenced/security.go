package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/cenkalti/backoff/v5"
	"github.com/redis/rueidis"
)

// securityFlags are the gRPC side's TLS and authorization: who may connect
// and what each caller may do. Every file is reloaded when it changes.
type securityFlags struct {
	// TLSCert and TLSKey are the server certificate chain and its key (PEM);
	// empty: plaintext gRPC.
	TLSCert string `name:"tls-cert" env:"FENCED_TLS_CERT" placeholder:"FILE" help:"Serve gRPC over TLS (1.2 at least) with this certificate chain (PEM); with --tls-key. Reloaded when it changes. Empty: plaintext."`
	TLSKey  string `name:"tls-key" env:"FENCED_TLS_KEY" placeholder:"FILE" help:"Private key (PEM) of --tls-cert."`
	// TLSClientCA is the CA bundle client certificates must chain to;
	// empty: no client certificates asked for.
	TLSClientCA string `name:"tls-client-ca" env:"FENCED_TLS_CLIENT_CA" placeholder:"FILE" help:"Require client certificates signed by this CA bundle (PEM): mutual TLS. Needs --tls-cert."`
	// AuthTokensFile is the bearer token file; empty: authorization off.
	AuthTokensFile string `name:"auth-tokens-file" env:"FENCED_AUTH_TOKENS_FILE" placeholder:"FILE" help:"Bearer tokens (JSON, see docs/security.md), each bound to slug patterns and to read, fenced (only fenced batches) or write; every call but health and reflection then needs one. Reloaded when it changes. Empty: authorization off, every caller may read and write every swarm."`
}

// security loads the TLS and token files the flags name and keeps reloading
// them until ctx is done or stop is called. It logs what is on and off.
func (f *securityFlags) security(ctx context.Context, log *slog.Logger) (sec server.Security, stop func(), err error) {
	ctx, stop = context.WithCancel(ctx)
	sec, err = f.load(ctx, log)
	if err != nil {
		stop()
		return sec, nil, err
	}
	return sec, stop, nil
}

func (f *securityFlags) load(ctx context.Context, log *slog.Logger) (server.Security, error) {
	var sec server.Security
	if (f.TLSCert == "") != (f.TLSKey == "") {
		return sec, errors.New("configuration: --tls-cert and --tls-key go together")
	}
	if f.TLSClientCA != "" && f.TLSCert == "" {
		return sec, errors.New("configuration: --tls-client-ca needs --tls-cert and --tls-key")
	}
	if f.TLSCert != "" {
		st, err := auth.LoadServerTLS(f.TLSCert, f.TLSKey, f.TLSClientCA, log)
		if err != nil {
			return sec, fmt.Errorf("configuration: --tls-cert/--tls-key/--tls-client-ca: %w", err)
		}
		go st.Watch(ctx)
		sec.TLS = st.Config()
		leaf := st.Leaf()
		log.Info("gRPC TLS on", "mutual_tls", st.MutualTLS(), "subject", leaf.Subject.String(),
			"not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	} else {
		log.Info("gRPC TLS off (no --tls-cert): serving plaintext")
	}
	if f.AuthTokensFile == "" {
		log.Warn("authorization OFF (no --auth-tokens-file): every caller may read and write every swarm")
		return sec, nil
	}
	a, err := auth.LoadTokens(f.AuthTokensFile, log)
	if err != nil {
		return sec, fmt.Errorf("configuration: --auth-tokens-file: %w", err)
	}
	go a.Watch(ctx)
	sec.Tokens = a
	log.Info("authorization on: bearer tokens", "path", f.AuthTokensFile, "tokens", a.Tokens().Len())
	if sec.TLS == nil {
		log.Warn("bearer tokens travel in plaintext: serve TLS (--tls-cert) unless a mesh encrypts the connection")
	}
	return sec, nil
}

// redisTLSFlags adjust the TLS of a rediss:// URL (rueidis.ParseURL turns
// TLS 1.2+ on, verifying the server against the system roots and the URL's
// host). ACL user and password come from the URL itself:
// rediss://user:password@host:port.
type redisTLSFlags struct {
	// RedisTLSCA replaces the system roots for Redis; empty: system roots.
	RedisTLSCA string `name:"redis-tls-ca" env:"FENCED_REDIS_TLS_CA" placeholder:"FILE" help:"CA bundle (PEM) that Redis's certificate must chain to, instead of the system roots. Needs a rediss:// URL."`
	// RedisTLSServerName is the name Redis's certificate must carry; empty:
	// the URL's (first) host.
	RedisTLSServerName string `name:"redis-tls-server-name" env:"FENCED_REDIS_TLS_SERVER_NAME" placeholder:"NAME" help:"Name Redis's certificate must carry, when it differs from the URL's host (every Cluster node is checked against it). Needs a rediss:// URL."`
	// RedisTLSCert and RedisTLSKey are a client certificate for Redis
	// (tls-auth-clients yes); empty: none.
	RedisTLSCert string `name:"redis-tls-cert" env:"FENCED_REDIS_TLS_CERT" placeholder:"FILE" help:"Client certificate (PEM) to present to Redis (redis.conf tls-auth-clients yes); with --redis-tls-key. Needs a rediss:// URL."`
	RedisTLSKey  string `name:"redis-tls-key" env:"FENCED_REDIS_TLS_KEY" placeholder:"FILE" help:"Private key (PEM) of --redis-tls-cert."`
	// ConnectTimeout is how long start-up waits for an unreachable Redis.
	ConnectTimeout time.Duration `name:"redis-connect-timeout" env:"FENCED_REDIS_CONNECT_TIMEOUT" default:"30s" help:"How long start-up keeps retrying a Redis that cannot be reached (it may start after fenced); a refusal by Redis (wrong password) fails at once."`
}

// clientOptions are store.ClientOptions(url) with the TLS flags applied.
func (f *redisTLSFlags) clientOptions(url string) (rueidis.ClientOption, error) {
	opt, err := store.ClientOptions(url)
	if err != nil {
		return opt, err
	}
	if f.RedisTLSCA == "" && f.RedisTLSServerName == "" && f.RedisTLSCert == "" && f.RedisTLSKey == "" {
		return opt, nil
	}
	if opt.TLSConfig == nil {
		return opt, errors.New("configuration: --redis-tls-* flags need a rediss:// URL")
	}
	if (f.RedisTLSCert == "") != (f.RedisTLSKey == "") {
		return opt, errors.New("configuration: --redis-tls-cert and --redis-tls-key go together")
	}
	if f.RedisTLSCA != "" {
		pem, err := os.ReadFile(f.RedisTLSCA)
		if err != nil {
			return opt, fmt.Errorf("configuration: --redis-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return opt, fmt.Errorf("configuration: --redis-tls-ca: %s holds no PEM certificate", f.RedisTLSCA)
		}
		opt.TLSConfig.RootCAs = pool
	}
	if f.RedisTLSServerName != "" {
		opt.TLSConfig.ServerName = f.RedisTLSServerName
	}
	if f.RedisTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(f.RedisTLSCert, f.RedisTLSKey)
		if err != nil {
			return opt, fmt.Errorf("configuration: --redis-tls-cert/--redis-tls-key: %w", err)
		}
		opt.TLSConfig.Certificates = []tls.Certificate{cert}
	}
	return opt, nil
}

// openStore connects to the Redis at url and returns a Store over it. A
// refused connection (wrong ACL password, TLS verification) fails here, at
// start-up, naming the address and the user but never the password.
func (f *redisTLSFlags) openStore(url string, o store.Options) (*store.Store, error) {
	opt, err := f.clientOptions(url)
	if err != nil {
		return nil, err
	}
	client, err := connect(&opt, f.ConnectTimeout)
	if err != nil {
		who := ""
		if opt.Username != "" {
			who = fmt.Sprintf(" as user %q", opt.Username)
		}
		tlsOn := ""
		if opt.TLSConfig != nil {
			tlsOn = " over TLS"
		}
		return nil, fmt.Errorf("connect to redis %s%s%s: %w", strings.Join(opt.InitAddress, ","), tlsOn, who, err)
	}
	// A connection that leads to a node that cannot take writes (a demoted
	// primary) is dropped and dialled again, resolving the address anew.
	o.Engine.Dial = func() (rueidis.Client, error) { return rueidis.NewClient(opt) }
	st, err := store.New(client, o)
	if err != nil {
		client.Close()
		return nil, err
	}
	return st, nil
}

// connect creates the rueidis client, retrying for up to timeout while
// Redis cannot be reached (it may start after fenced, or be failing over);
// an error reply of Redis (a wrong password, an ACL refusal) fails at once.
// store.NewClient may set opt.ForceSingleClient (a server that only mimics
// Cluster, such as the embedded Redis).
func connect(opt *rueidis.ClientOption, timeout time.Duration) (rueidis.Client, error) {
	return backoff.Retry(context.Background(), func() (rueidis.Client, error) {
		client, err := store.NewClient(opt)
		if err != nil && refused(err) {
			return nil, backoff.Permanent(err)
		}
		if err != nil {
			slog.Warn("redis not reachable yet; retrying", "addr", strings.Join(opt.InitAddress, ","), "err", err)
		}
		return client, err
	}, backoff.WithMaxElapsedTime(timeout), backoff.WithBackOff(&backoff.ExponentialBackOff{
		InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: 2 * time.Second,
	}))
}

// refused reports whether connecting failed because Redis (or its TLS)
// said no, rather than because it could not be reached: retrying cannot
// help then.
func refused(err error) bool {
	var (
		redisErr  *rueidis.RedisError
		verify    *tls.CertificateVerificationError
		header    tls.RecordHeaderError
		alert     tls.AlertError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return errors.As(err, &redisErr) || errors.As(err, &verify) || errors.As(err, &header) ||
		errors.As(err, &alert) || errors.As(err, &authority) || errors.As(err, &hostname) || errors.As(err, &invalid)
}
