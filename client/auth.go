package client

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// WithBearerToken sends token with every call, as the metadata
// "authorization: Bearer <token>" that fenced's --auth-tokens-file checks.
// The token is sent over TLS only: pass grpc.WithTransportCredentials with
// TLS credentials too, or Dial fails ("the credentials require transport
// level security"). WithInsecureBearerToken lifts that, for a connection
// encrypted by other means.
//
//	creds := credentials.NewClientTLSFromCert(pool, "")
//	c, err := client.Dial("fenced:7420", grpc.WithTransportCredentials(creds), client.WithBearerToken(tok))
func WithBearerToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearer{token: token, secure: true})
}

// WithInsecureBearerToken is WithBearerToken that also sends the token over
// a plaintext connection, where anyone on the path can read it: only for a
// connection encrypted outside gRPC (a service mesh's mTLS, a loopback
// address, a test).
func WithInsecureBearerToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearer{token: token})
}

// bearer is per-call credentials carrying one bearer token.
type bearer struct {
	token  string
	secure bool
}

var _ credentials.PerRPCCredentials = bearer{}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }
