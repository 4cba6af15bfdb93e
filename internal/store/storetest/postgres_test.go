package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStartPostgres: the private server answers, refuses while stopped,
// and answers again after Start and Restart.
func TestStartPostgres(t *testing.T) {
	pg := StartPostgres(t)
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.URL())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return conn.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("fresh server: %v", err)
	}
	pg.Restart(t)
	if err := ping(); err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	pg.Stop(t)
	if err := ping(); err == nil {
		t.Fatal("stopped server still answers")
	}
	pg.Start(t)
	if err := ping(); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}
