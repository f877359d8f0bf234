package server_test

import (
	"slices"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/google/go-cmp/cmp"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

// wantServices must be listed by reflection, as grpcurl users see them.
var wantServices = []string{
	"fenced.v1.RecordsService",
	"fenced.v1.LeaseService",
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}

func TestReflection(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})

	t.Run("v1", func(t *testing.T) {
		stream, err := reflectionv1.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatalf("v1 ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(&reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
			t.Fatalf("v1 send ListServices: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("v1 ListServices: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		assertListed(t, "v1", names)

		// The descriptor of the service resolves, with every RPC.
		if err := stream.Send(&reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "fenced.v1.RecordsService"}}); err != nil {
			t.Fatalf("v1 send FileContainingSymbol: %v", err)
		}
		resp, err = stream.Recv()
		if err != nil {
			t.Fatalf("v1 FileContainingSymbol: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("v1 FileContainingSymbol(fenced.v1.RecordsService) = error %d %s", e.GetErrorCode(), e.GetErrorMessage())
		}
		var methods []string
		for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				t.Fatalf("v1 FileContainingSymbol: decode descriptor: %v", err)
			}
			if fd.GetPackage() != "fenced.v1" {
				continue
			}
			for _, s := range fd.GetService() {
				if s.GetName() != "RecordsService" {
					continue
				}
				for _, m := range s.GetMethod() {
					methods = append(methods, m.GetName())
				}
			}
		}
		want := []string{"FencedBatch", "Layout", "Record", "ScanSection", "Sections", "Watch"}
		slices.Sort(methods)
		if diff := cmp.Diff(want, methods); diff != "" {
			t.Errorf("v1 fenced.v1.RecordsService methods mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("v1alpha", func(t *testing.T) {
		stream, err := reflectionv1alpha.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatalf("v1alpha ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(&reflectionv1alpha.ServerReflectionRequest{
			MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
			t.Fatalf("v1alpha send ListServices: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("v1alpha ListServices: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		assertListed(t, "v1alpha", names)
	})
}

func assertListed(t *testing.T, version string, names []string) {
	t.Helper()
	for _, want := range wantServices {
		if !slices.Contains(names, want) {
			t.Errorf("reflection %s ListServices = %q, want it to list %s", version, names, want)
		}
	}
}

// TestShutdownCutsOpenReflectionStreams: grpcurl keeps its reflection
// stream open for as long as its call runs (a Watch: forever), so, like a
// Watch, an open reflection stream must not hold the graceful stop until
// --shutdown-timeout: with a grace that never ends, Shutdown still returns
// once the other calls have drained, and the streams are cut.
func TestShutdownCutsOpenReflectionStreams(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	v1, err := reflectionv1.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatalf("v1 ServerReflectionInfo: %v", err)
	}
	if err := v1.Send(&reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatalf("v1 send ListServices: %v", err)
	}
	if _, err := v1.Recv(); err != nil {
		t.Fatalf("v1 ListServices: %v", err)
	}
	v1alpha, err := reflectionv1alpha.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatalf("v1alpha ServerReflectionInfo: %v", err)
	}
	if err := v1alpha.Send(&reflectionv1alpha.ServerReflectionRequest{
		MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatalf("v1alpha send ListServices: %v", err)
	}
	if _, err := v1alpha.Recv(); err != nil {
		t.Fatalf("v1alpha ListServices: %v", err)
	}

	done := make(chan error, 1)
	go func() { done <- e.shutdown(24 * time.Hour) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("Shutdown (grace 24h) still waiting after %v with two reflection streams open, want it to cut them", waitLimit)
	}
	if resp, err := v1.Recv(); err == nil {
		t.Errorf("after Shutdown, the v1 reflection stream delivered %v, want it ended", resp)
	}
	if resp, err := v1alpha.Recv(); err == nil {
		t.Errorf("after Shutdown, the v1alpha reflection stream delivered %v, want it ended", resp)
	}
}
