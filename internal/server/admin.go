package server

import (
	"context"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/docstore"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// Migrator moves swarms between layouts: *store.Store implements it.
type Migrator interface {
	Migrate(ctx context.Context, slug string, dryRun bool) (*docstore.Migration, error)
}

// AdminService implements fencedv1.AdminServiceServer over a Migrator.
type AdminService struct {
	fencedv1.UnimplementedAdminServiceServer
	m Migrator
}

// NewAdminService returns the AdminService handlers over m.
func NewAdminService(m Migrator) *AdminService { return &AdminService{m: m} }

// Migrate moves one swarm from the document layout onto the records.
func (a *AdminService) Migrate(ctx context.Context, req *fencedv1.MigrateRequest) (*fencedv1.MigrateResponse, error) {
	if err := batch.CheckMigrate(req.GetSlug(), req.GetWritersUpgraded()); err != nil {
		return nil, toStatus(err)
	}
	m, err := a.m.Migrate(ctx, req.GetSlug(), req.GetDryRun())
	if err != nil {
		return nil, toStatus(err)
	}
	return MigrateResponse(m), nil
}

// MigrateResponse is the wire form of a docstore.Migration.
func MigrateResponse(m *docstore.Migration) *fencedv1.MigrateResponse {
	resp := &fencedv1.MigrateResponse{Records: int64(m.Records), Revision: m.Revision, AlreadyMoved: m.AlreadyMoved, NoState: m.NoState}
	for _, s := range m.Sections {
		resp.Sections = append(resp.Sections, &fencedv1.MigratedSection{Name: s.Name, Records: int64(s.Records), Bytes: int64(s.Bytes)})
	}
	return resp
}
