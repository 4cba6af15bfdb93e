package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchImageSize is about a small actor's checkpoint (pages.img ≈ 18 MB).
const benchImageSize = 20 << 20

func benchTree(b *testing.B) string {
	b.Helper()
	src := b.TempDir()
	writeTree(b, src, []treeEntry{
		{path: "checkpoint.img", mode: 0o644, content: string(mixedContent(64<<10, 7))},
		{path: "pages.img", mode: 0o644, content: string(mixedContent(benchImageSize, 8))},
	})
	return src
}

func BenchmarkUpload(b *testing.B) {
	src := benchTree(b)
	store := newDirStore(b)
	ctx := context.Background()
	b.SetBytes(benchImageSize + 64<<10)
	var stored int64
	i := 0
	for b.Loop() {
		loc := fmt.Sprintf("default/actor/snap-%d", i)
		_, _, size, err := Upload(ctx, store, loc, src)
		if err != nil {
			b.Fatal(err)
		}
		stored = size
		i++
	}
	b.ReportMetric(float64(stored)/float64(benchImageSize+64<<10), "stored/raw")
}

func BenchmarkDownload(b *testing.B) {
	src := benchTree(b)
	store := newDirStore(b)
	ctx := context.Background()
	const loc = "default/actor/snap"
	_, digest, _, err := Upload(ctx, store, loc, src)
	if err != nil {
		b.Fatal(err)
	}
	out := b.TempDir()
	b.SetBytes(benchImageSize + 64<<10)
	i := 0
	for b.Loop() {
		dest := filepath.Join(out, fmt.Sprint(i))
		if err := Download(ctx, store, loc, digest, dest); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dest)
		b.StartTimer()
		i++
	}
}
