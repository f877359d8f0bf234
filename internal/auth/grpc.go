package auth

import (
	"context"
	"errors"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	mwauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// MethodAccess is what each fenced RPC needs of a token. A method of a
// service that is neither here nor in OpenServices is refused with
// PERMISSION_DENIED whatever the token: a new RPC must be classified before
// anyone can call it with authorization on.
var MethodAccess = map[string]Access{
	fencedv1.RecordsService_Layout_FullMethodName:         Read,
	fencedv1.RecordsService_Sections_FullMethodName:       Read,
	fencedv1.RecordsService_StreamSections_FullMethodName: Read,
	fencedv1.RecordsService_ScanSection_FullMethodName:    Read,
	fencedv1.RecordsService_Record_FullMethodName:         Read,
	fencedv1.RecordsService_Watch_FullMethodName:          Read,
	fencedv1.LeaseService_Current_FullMethodName:          Read,
	// A fenced token's FencedBatch must be fenced when it writes
	// (fencedBatchUnfenced).
	fencedv1.RecordsService_FencedBatch_FullMethodName: Fenced,
	fencedv1.LeaseService_Acquire_FullMethodName:       Fenced,
	fencedv1.LeaseService_Renew_FullMethodName:         Fenced,
	fencedv1.LeaseService_Release_FullMethodName:       Fenced,
	// Migrate rewrites the swarm's whole state: a write to its slug.
	fencedv1.AdminService_Migrate_FullMethodName: Write,
}

// OpenServices are the services every caller may use without a token:
// health (Kubernetes probes, load balancers) and server reflection
// (grpcurl's describe and list).
var OpenServices = []string{
	healthpb.Health_ServiceDesc.ServiceName,
	reflectionv1.ServerReflection_ServiceDesc.ServiceName,
	reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName,
}

// ErrorInfo reasons of refused calls (domain "fenced"), declared in
// proto/fenced/v1/errors.proto (ErrorReason.Reason).
var (
	// ReasonTokenMissing (UNAUTHENTICATED): no "authorization: Bearer ..."
	// metadata.
	ReasonTokenMissing = fencedv1.ErrorReason_TOKEN_MISSING.String()
	// ReasonTokenUnknown (UNAUTHENTICATED): the token is not in the token
	// file.
	ReasonTokenUnknown = fencedv1.ErrorReason_TOKEN_UNKNOWN.String()
	// ReasonSlugDenied (PERMISSION_DENIED): the token's slug patterns do not
	// match the request's slug. Metadata: token (its name), slug.
	ReasonSlugDenied = fencedv1.ErrorReason_SLUG_NOT_PERMITTED.String()
	// ReasonReadOnly (PERMISSION_DENIED): a read token called a write RPC.
	// Metadata: token, slug.
	ReasonReadOnly = fencedv1.ErrorReason_WRITE_NOT_PERMITTED.String()
	// ReasonMethodDenied (PERMISSION_DENIED): the RPC is not classified in
	// MethodAccess. Metadata: token, method.
	ReasonMethodDenied = fencedv1.ErrorReason_METHOD_NOT_PERMITTED.String()
	// ReasonUnfencedWrite (PERMISSION_DENIED): a fenced token sent an
	// unfenced FencedBatch that writes, or called Migrate. Metadata: token,
	// slug.
	ReasonUnfencedWrite = fencedv1.ErrorReason_UNFENCED_WRITE_NOT_PERMITTED.String()
)

// domain is the ErrorInfo domain of every fenced error.
const domain = "fenced"

type tokenKey struct{}

// Caller returns the token that authorized the call of ctx, or nil when
// authorization is off or the call is to an open service.
func Caller(ctx context.Context) *Token {
	t, _ := ctx.Value(tokenKey{}).(*Token)
	return t
}

// slugged is every fenced request message.
type slugged interface{ GetSlug() string }

// UnaryServerInterceptor checks every unary call but those to OpenServices:
// the bearer token (go-grpc-middleware's auth interceptor reads the
// "authorization" metadata) against the tokens loaded now, then the request's
// slug and the RPC's access (MethodAccess). A refused call never reaches the
// handler, so nothing reaches Redis. Codes: UNAUTHENTICATED (no token, or
// an unknown one), PERMISSION_DENIED (slug not matched, a write with a read
// token, an unclassified RPC), each with an ErrorInfo.
func (a *Authorizer) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	authn := mwauth.UnaryServerInterceptor(a.authenticate)
	check := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return authn(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			if err := authorize(ctx, info.FullMethod, req); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		})
	}
	return selector.UnaryServerInterceptor(check, selector.MatchFunc(needsToken))
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: the token
// is checked when the stream opens, the slug of every message received,
// and again on every reload of the token file while the stream is open
// (streams.go): RecordsService Watch, opened with a token the file then
// drops or narrows, ends UNAUTHENTICATED or PERMISSION_DENIED within a
// reload interval.
func (a *Authorizer) StreamServerInterceptor() grpc.StreamServerInterceptor {
	authn := mwauth.StreamServerInterceptor(a.authenticate)
	check := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return authn(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
			if _, ok := MethodAccess[info.FullMethod]; !ok {
				return refuse(ss.Context(), info.FullMethod, "", errMethodDenied)
			}
			cs := &checkedStream{ServerStream: ss, method: info.FullMethod, a: a}
			err := handler(srv, cs)
			if cs.done != nil {
				err = cs.done(err)
			}
			return err
		})
	}
	return selector.StreamServerInterceptor(check, selector.MatchFunc(needsToken))
}

// needsToken is true for every service but the open ones.
func needsToken(_ context.Context, c interceptors.CallMeta) bool {
	for _, s := range OpenServices {
		if c.Service == s {
			return false
		}
	}
	return true
}

// authenticate is the go-grpc-middleware AuthFunc: it finds the bearer
// token among the tokens loaded now and puts it in the context.
func (a *Authorizer) authenticate(ctx context.Context) (context.Context, error) {
	bearer, err := mwauth.AuthFromMD(ctx, "bearer")
	if err != nil {
		bearer = ""
	}
	t, err := a.cur.Load().Lookup(bearer)
	if err != nil {
		return nil, refuse(ctx, "", "", err)
	}
	return context.WithValue(ctx, tokenKey{}, t), nil
}

var errMethodDenied = errors.New("auth: method not permitted with a token")

// authorize checks the caller's token against method and req's slug.
func authorize(ctx context.Context, method string, req any) error {
	need, ok := MethodAccess[method]
	if !ok {
		return refuse(ctx, method, "", errMethodDenied)
	}
	m, ok := req.(slugged)
	if !ok {
		return refuse(ctx, method, "", errMethodDenied)
	}
	t := Caller(ctx)
	if err := t.Permits(m.GetSlug(), need); err != nil {
		return refuse(ctx, method, m.GetSlug(), err)
	}
	if b, ok := req.(*fencedv1.FencedBatchRequest); ok && t.Access == Fenced && fencedBatchUnfenced(b) {
		return refuse(ctx, method, m.GetSlug(), ErrUnfencedWrite)
	}
	return nil
}

// fencedBatchUnfenced: b has neither a lease fence nor a claim fence and
// puts or deletes (a batch of checks alone writes nothing).
func fencedBatchUnfenced(b *fencedv1.FencedBatchRequest) bool {
	if b.GetFence() != nil || b.GetClaim() != nil {
		return false
	}
	for _, w := range b.GetWrites() {
		if k := w.GetKind(); k == fencedv1.WriteKind_WRITE_KIND_PUT || k == fencedv1.WriteKind_WRITE_KIND_DELETE {
			return true
		}
	}
	return false
}

// refuse turns an error of this package into a gRPC status with an
// ErrorInfo. Unauthenticated callers learn nothing but that.
func refuse(ctx context.Context, method, slug string, err error) error {
	var (
		code   codes.Code
		reason string
		msg    string
		meta   map[string]string
	)
	name := ""
	if t := Caller(ctx); t != nil {
		name = t.Name
	}
	switch {
	case errors.Is(err, ErrTokenMissing):
		code, reason, msg = codes.Unauthenticated, ReasonTokenMissing, `no bearer token: send metadata "authorization: Bearer <token>"`
	case errors.Is(err, ErrTokenUnknown):
		code, reason, msg = codes.Unauthenticated, ReasonTokenUnknown, "unknown bearer token"
	case errors.Is(err, ErrSlugDenied):
		code, reason, msg = codes.PermissionDenied, ReasonSlugDenied, "token "+name+" is not permitted for swarm "+slug
		meta = map[string]string{"token": name, "slug": slug}
	case errors.Is(err, ErrReadOnly):
		code, reason, msg = codes.PermissionDenied, ReasonReadOnly, "token "+name+" permits reads only"
		meta = map[string]string{"token": name, "slug": slug}
	case errors.Is(err, ErrUnfencedWrite):
		code, reason, msg = codes.PermissionDenied, ReasonUnfencedWrite, "token "+name+
			" permits fenced writes only: fence the batch with the swarm's lease (or a claim); nothing was written"
		meta = map[string]string{"token": name, "slug": slug}
	default:
		code, reason, msg = codes.PermissionDenied, ReasonMethodDenied, "method "+method+" is not permitted with a token"
		meta = map[string]string{"token": name, "method": method}
	}
	st, derr := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain, Metadata: meta})
	if derr != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

// checkedStream authorizes every message a stream receives (its token as
// loaded now, not as when the stream opened); once the
// first is authorized, the stream is registered for the token file's
// reloads (Authorizer.watchRevocation) and its handler runs under the
// context a revocation cancels.
type checkedStream struct {
	grpc.ServerStream
	method string
	a      *Authorizer
	ctx    context.Context
	done   func(error) error
}

func (s *checkedStream) Context() context.Context {
	if s.ctx != nil {
		return s.ctx
	}
	return s.ServerStream.Context()
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := authorize(s.Context(), s.method, m); err != nil {
		return err
	}
	sl, _ := m.(slugged) // authorize refuses a message without a slug
	if s.done == nil {
		s.ctx, s.done = s.a.watchRevocation(s.ServerStream.Context(), s.method, sl.GetSlug(), MethodAccess[s.method])
	}
	// The token was looked up when the stream opened: a reload since (its
	// recheck did not see a stream not registered yet) may have dropped or
	// narrowed it. Checked against the tokens loaded now, after the
	// registration, no reload is missed: one that stored its tokens after
	// this load rechecks the stream.
	if _, err := s.a.cur.Load().Recheck(Caller(s.ServerStream.Context()), sl.GetSlug(), MethodAccess[s.method]); err != nil {
		return refuse(s.Context(), s.method, sl.GetSlug(), err)
	}
	return nil
}
