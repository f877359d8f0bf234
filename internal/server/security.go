package server

import (
	"crypto/tls"

	"github.com/agentihooks/fenced/internal/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Security is how the server authenticates and authorizes callers. The zero
// value serves plaintext gRPC and lets every call through.
type Security struct {
	// TLS, when not nil, makes the server speak TLS only (plaintext clients
	// fail the handshake); auth.ServerTLS.Config gives one that reloads its
	// files and, with a client CA, requires client certificates (mTLS).
	TLS *tls.Config
	// Tokens, when not nil, checks the bearer token, slug and access of
	// every call but health and reflection (auth.Authorizer's
	// interceptors); refused calls never reach the handlers.
	Tokens *auth.Authorizer
}

// creds is the server's transport credentials: nil (plaintext) without TLS.
func (s Security) creds() grpc.ServerOption {
	if s.TLS == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.Creds(credentials.NewTLS(s.TLS))
}

// unary is the authorization interceptor; nil without tokens (the chain
// leaves it out: present).
func (s Security) unary() grpc.UnaryServerInterceptor {
	if s.Tokens == nil {
		return nil
	}
	return s.Tokens.UnaryServerInterceptor()
}

// stream is unary for streams.
func (s Security) stream() grpc.StreamServerInterceptor {
	if s.Tokens == nil {
		return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, ss)
		}
	}
	return s.Tokens.StreamServerInterceptor()
}
