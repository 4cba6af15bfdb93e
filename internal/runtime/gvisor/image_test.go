package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// TestCheckImage: a complete image passes; one cut where a sandbox that
// dies while it saves itself leaves it (checkpoint.img ends after its
// metadata), or one without checkpoint.img, is ErrNoImage.
func TestCheckImage(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := h.slots[0]
	if err := h.rt.Run(ctx, a, h.workload(t)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	img := filepath.Join(t.TempDir(), "image")
	if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.CheckImage(img); err != nil {
		t.Fatalf("complete image: %v", err)
	}

	state := filepath.Join(img, "checkpoint.img")
	body, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	header := len(stateMagic) + 8
	cut := header + int(binary.BigEndian.Uint64(body[len(stateMagic):header]))
	if cut >= len(body) {
		t.Fatalf("checkpoint.img: %d bytes, metadata ends at %d: no kernel state", len(body), cut)
	}
	if err := os.Truncate(state, int64(cut)); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.CheckImage(img); !errors.Is(err, runtime.ErrNoImage) {
		t.Fatalf("image cut after its metadata: %v, want ErrNoImage", err)
	}
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.CheckImage(img); !errors.Is(err, runtime.ErrNoImage) {
		t.Fatalf("image without checkpoint.img: %v, want ErrNoImage", err)
	}
}
