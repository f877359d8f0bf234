package client_test

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// gzipGate is a RecordsService in front of a real fenced that relays every
// Watch to it and counts the Watches sent compressed and uncompressed. With
// refuse it answers a compressed Watch as a fenced without gzip support
// does (a grpc-go server with no gzip decompressor registered refuses the
// call before reading the request, with this status), which a test binary
// cannot be once gzip is imported: the client imports it. With noWatch it
// answers every Watch as a server without the method does.
type gzipGate struct {
	fencedv1.UnimplementedRecordsServiceServer
	upstream fencedv1.RecordsServiceClient
	refuse   bool
	noWatch  bool

	compressed, plain atomic.Int64
}

func (g *gzipGate) Watch(req *fencedv1.WatchRequest, stream fencedv1.RecordsService_WatchServer) error {
	// The request's grpc-encoding, as fenced's server reads it (sharedGzip).
	ts, ok := grpc.ServerTransportStreamFromContext(stream.Context()).(interface{ RecvCompress() string })
	if !ok {
		return status.Error(codes.Internal, "gzipGate: the transport stream does not tell the request's encoding")
	}
	if enc := ts.RecvCompress(); enc != "" && enc != encoding.Identity {
		g.compressed.Add(1)
		if g.refuse {
			return status.Errorf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", enc)
		}
	} else {
		g.plain.Add(1)
	}
	if g.noWatch {
		return g.UnimplementedRecordsServiceServer.Watch(req, stream)
	}
	up, err := g.upstream.Watch(stream.Context(), req)
	if err != nil {
		return err
	}
	for {
		resp, err := up.Recv()
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// serveGate serves g on a loopback port, relaying to the fixture's fenced,
// and answers its address; stopped when the test ends.
func (f *fixture) serveGate(t *testing.T, g *gzipGate) string {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	g.upstream = fencedv1.NewRecordsServiceClient(conn)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := grpc.NewServer()
	fencedv1.RegisterRecordsServiceServer(s, g)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestWatchFallsBackToUncompressedOnceAServerRefusesGzip(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		refuse                    bool
		wantCompressed, wantPlain int64
	}{
		// The first Watch is refused, asked again uncompressed at once; the
		// second goes uncompressed straight away.
		{name: "fenced without gzip", refuse: true, wantCompressed: 1, wantPlain: 2},
		{name: "fenced with gzip", refuse: false, wantCompressed: 2, wantPlain: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t)
			gate := &gzipGate{refuse: tc.refuse}
			c, err := client.Dial(f.serveGate(t, gate))
			if err != nil {
				t.Fatalf("client.Dial: %v", err)
			}
			defer c.Close()
			slug := newSlug(t)
			ctx := ctxT(t)
			var revs []int64
			for i := range 2 {
				rev, err := f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "k", Expected: client.Blind, Value: []byte(strconv.Itoa(i))}})
				if err != nil {
					t.Fatalf("Batch %d: %v", i, err)
				}
				revs = append(revs, rev)
			}
			for watch := range 2 {
				for ev, err := range c.Watch(ctx, slug, revs[0]) {
					if err != nil {
						t.Fatalf("Watch %d (from %d): %v, want the event of revision %d", watch, revs[0], err, revs[1])
					}
					if ev.Revision != revs[1] || len(ev.Changes) != 1 || ev.Changes[0].Record == nil || string(ev.Changes[0].Record.Value) != "1" {
						t.Errorf("Watch %d (from %d): event %+v, want revision %d putting claims/k = 1", watch, revs[0], ev, revs[1])
					}
					break
				}
			}
			if got, gotPlain := gate.compressed.Load(), gate.plain.Load(); got != tc.wantCompressed || gotPlain != tc.wantPlain {
				t.Errorf("two Watches of one Client sent %d compressed and %d uncompressed, want %d and %d", got, gotPlain, tc.wantCompressed, tc.wantPlain)
			}
		})
	}
}

func TestWatchEndsUnimplementedWhenTheServerHasNoWatch(t *testing.T) {
	f := start(t)
	gate := &gzipGate{noWatch: true}
	c, err := client.Dial(f.serveGate(t, gate))
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	defer c.Close()
	n := 0
	for _, err := range c.Watch(ctxT(t), newSlug(t), 0) {
		n++
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("Watch yielded %v, want an UNIMPLEMENTED error", err)
		}
	}
	if n != 1 || gate.compressed.Load() != 1 || gate.plain.Load() != 1 {
		t.Errorf("Watch yielded %d times after %d compressed and %d uncompressed requests, want 1 after 1 and 1", n, gate.compressed.Load(), gate.plain.Load())
	}
}
