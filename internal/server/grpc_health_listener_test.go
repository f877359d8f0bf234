package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestHealthAloneOnItsOwnListener(t *testing.T) {
	f := fencedtest.Serve(t, fencedtest.Open(t, redistest.Start(t)), fencedtest.Config{Options: server.Options{HealthInterval: 20 * time.Millisecond}})
	s := f.Server
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	healthDone := make(chan error, 1)
	go func() { healthDone <- s.ServeHealth(hl) }()

	conn, err := grpc.NewClient(hl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: "fenced"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("Watch(fenced) on the health listener: %v", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	if resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check(liveness) on the health listener = %v, %v", resp, err)
	}
	// Only health is served there.
	if err := conn.Invoke(ctx, "/fenced.v1.RecordsService/Layout", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}); err == nil {
		t.Error("RecordsService answered on the health-only listener")
	}
	if err := f.Stop(ctx); err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
	if err := <-healthDone; err != nil {
		t.Errorf("ServeHealth after Shutdown = %v, want nil", err)
	}
}
