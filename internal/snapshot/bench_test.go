package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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

// bigImageSize is a big actor's memory image (issue 17: ~200 MB Redis).
const bigImageSize = 200 << 20

// bigContent imitates a big actor's pages: mostly text-like data (the
// values an in-memory store holds), some incompressible pages, no pages
// of zeros (gVisor leaves those out of its pages file). zstd keeps about
// a quarter of it; a real 218 MB Redis checkpoint kept 15%.
func bigContent(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	words := make([][]byte, 512)
	for i := range words {
		w := make([]byte, 3+rng.IntN(9))
		for j := range w {
			w[j] = 'a' + byte(rng.IntN(26))
		}
		words[i] = append(w, ' ')
	}
	b := make([]byte, 0, n)
	for len(b) < n {
		page := min(4096, n-len(b))
		if rng.IntN(8) == 0 {
			for range page {
				b = append(b, byte(rng.Uint32()))
			}
			continue
		}
		end := len(b) + page
		for len(b) < end {
			b = append(b, words[rng.IntN(len(words))]...)
		}
		b = b[:end]
	}
	return b
}

// changed rewrites frac of b in ten regions spread over it and inserts a
// few bytes before the second, as one more checkpoint of the same actor
// would differ.
func changed(b []byte, frac float64) []byte {
	out := bytes.Clone(b)
	region := int(float64(len(b)) * frac / 10)
	rng := rand.New(rand.NewPCG(42, 42))
	for i := range 10 {
		off := i * len(b) / 10
		for j := off; j < off+region; j++ {
			out[j] = byte(rng.Uint32())
		}
	}
	at := len(b)/10 + region + 4096
	return slices.Concat(out[:at], []byte("12 more bytes"), out[at:])
}

func bigTree(b *testing.B, pages []byte) string {
	b.Helper()
	src := b.TempDir()
	writeTree(b, src, []treeEntry{
		{path: "checkpoint.img", mode: 0o644, content: string(bigContent(512<<10, 1))},
		{path: "pages.img", mode: 0o644, content: string(pages)},
	})
	return src
}

// BenchmarkBigUpload stores a ~200 MB checkpoint: whole files (version 1,
// the baseline), chunks into an empty store, and chunks after the
// actor's previous snapshot with 5% of its pages changed.
func BenchmarkBigUpload(b *testing.B) {
	pages := bigContent(bigImageSize, 2)
	first := bigTree(b, pages)
	second := bigTree(b, changed(pages, 0.05))
	ctx := context.Background()
	run := func(b *testing.B, prepare func(ObjectStore), upload func(ObjectStore, string) (int64, error)) {
		b.SetBytes(bigImageSize)
		var stored, put int64
		for b.Loop() {
			b.StopTimer()
			base := newDirStore(b)
			prepare(base)
			before := putBytes(b, base)
			b.StartTimer()
			size, err := upload(base, "default/actor/snap")
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			stored, put = size, putBytes(b, base)-before
			b.StartTimer()
		}
		b.ReportMetric(float64(stored)/bigImageSize, "stored/raw")
		b.ReportMetric(float64(put)/bigImageSize, "put/raw")
	}
	none := func(ObjectStore) {}
	b.Run("wholefile", func(b *testing.B) {
		run(b, none, func(s ObjectStore, loc string) (int64, error) {
			_, _, size, err := uploadWholeFiles(ctx, s, loc, first)
			return size, err
		})
	})
	chunked := func(src string) func(ObjectStore, string) (int64, error) {
		return func(s ObjectStore, loc string) (int64, error) {
			_, _, size, err := Upload(ctx, s, loc, src)
			return size, err
		}
	}
	b.Run("chunked-first", func(b *testing.B) { run(b, none, chunked(first)) })
	b.Run("chunked-after-5pct-change", func(b *testing.B) {
		run(b, func(s ObjectStore) {
			if _, _, _, err := Upload(ctx, s, "default/actor/parent", first); err != nil {
				b.Fatal(err)
			}
		}, chunked(second))
	})
}

// BenchmarkBigDownload restores a ~200 MB checkpoint stored as whole
// files (the baseline) and as chunks.
func BenchmarkBigDownload(b *testing.B) {
	src := bigTree(b, bigContent(bigImageSize, 2))
	ctx := context.Background()
	for _, v := range []struct {
		name   string
		upload func(context.Context, ObjectStore, string, string) (*Manifest, string, int64, error)
	}{{"wholefile", uploadWholeFiles}, {"chunked", Upload}} {
		b.Run(v.name, func(b *testing.B) {
			store := newDirStore(b)
			const loc = "default/actor/snap"
			_, digest, _, err := v.upload(ctx, store, loc, src)
			if err != nil {
				b.Fatal(err)
			}
			out := b.TempDir()
			b.SetBytes(bigImageSize)
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
		})
	}
}

// putBytes is what the store holds, in bytes.
func putBytes(b *testing.B, s *DirStore) int64 {
	objs, err := s.List(context.Background(), "")
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	return n
}
