package gvisor

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Checkpoint images: what a restore checks of an image before it starts a
// sandbox for it.

// stateMagic begins runsc's state file (checkpoint.img): it is followed
// by an 8-byte big-endian metadata length, the metadata, and the
// sandbox's kernel state.
const stateMagic = "gVisorSF"

// CheckImage reports whether imageDir holds a complete memory image as
// far as can be told without restoring it. A sandbox finishes a capture
// it began even when the runsc command that asked for it dies, but one
// that itself dies while saving leaves checkpoint.img with its header
// and metadata only: the kernel state is written last, after memory.
func (r *Runtime) CheckImage(imageDir string) error {
	_, err := imageMetadata(imageDir)
	return err
}

// imageMetadata reads the metadata of the complete memory image in
// imageDir (see CheckImage).
func imageMetadata(imageDir string) (map[string]string, error) {
	path := filepath.Join(imageDir, "checkpoint.img")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("memory image %s: %w (%w)", imageDir, runtime.ErrNoImage, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("memory image %s: %w", imageDir, err)
	}
	header := make([]byte, len(stateMagic)+8)
	if _, err := io.ReadFull(f, header); err != nil || string(header[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("memory image %s: %s has no state file header: %w", imageDir, path, runtime.ErrNoImage)
	}
	n := binary.BigEndian.Uint64(header[len(stateMagic):])
	if end := int64(len(header)) + int64(n); fi.Size() <= end || end < 0 {
		return nil, fmt.Errorf("memory image %s: %s ends after its metadata (%d bytes): the capture was cut short: %w", imageDir, path, fi.Size(), runtime.ErrNoImage)
	}
	raw := make([]byte, n)
	metadata := map[string]string{}
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, fmt.Errorf("memory image %s: metadata: %w", imageDir, err)
	}
	if err := json.Unmarshal(raw, &metadata); err != nil {
		return nil, fmt.Errorf("memory image %s: metadata: %w", imageDir, err)
	}
	return metadata, nil
}

// checkImageContainers makes sure the image in imageDir holds exactly the
// containers of w. runsc restores the image's containers as they join the
// sandbox and completes the restore with the last one: a workload with a
// container fewer would leave it waiting for good, one with another
// container would fail only after its sandbox was made.
func checkImageContainers(imageDir string, containers []runtime.Checked) error {
	metadata, err := imageMetadata(imageDir)
	if err != nil {
		return err
	}
	var specs map[string]json.RawMessage
	if err := json.Unmarshal([]byte(metadata["container_specs"]), &specs); err != nil {
		return fmt.Errorf("memory image %s: container specs: %w", imageDir, err)
	}
	have := slices.Sorted(maps.Keys(specs))
	want := make([]string, 0, len(containers))
	for i := range containers {
		if name := annotations(containers, i, "")[annotationName]; name != "" {
			want = append(want, name)
		} else {
			// runsc's own name for an unnamed container, by creation order.
			want = append(want, "__no_name_"+strconv.Itoa(i))
		}
	}
	slices.Sort(want)
	if !slices.Equal(have, want) {
		return fmt.Errorf("memory image %s holds containers %q, the workload has %q: it was taken from another workload", imageDir, have, want)
	}
	return nil
}
