package gvisor

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"
)

// Hostnames. A sandbox's hostname is its actor's name, and gVisor fixes
// it when the sandbox is made: `runsc create` boots the kernel with the
// spec's hostname, and `runsc restore` into that sandbox gives every
// restored UTS namespace the same one, unless the guest had set its
// hostname itself (sethostname), which a checkpoint keeps. So a warm
// sandbox made for one actor would restore any other with the wrong
// name. Instead of giving such a sandbox up, the runtime sets the
// hostname right after the restore, before the start returns (and so
// before anything but the restored workload itself runs there): `runsc
// exec` of a tiny program, passed by file descriptor (the guest needs no
// binary of its own), that calls sethostname(2).
//
// That call also pins the name in the guest: the actor's later
// checkpoints carry it and their restores keep it, whatever sandbox they
// land in. The runtime records a pinned name in the sandbox's bundle
// (pinnedFile) and in every memory image taken of it (the same file in
// the image directory), so a restore of such an image into a sandbox
// made for another actor needs no exec, and a restore of it for another
// actor (a fork) knows that it does. Only a restore of a pinned image
// for the actor it names, or into a sandbox whose spec names the actor,
// skips the exec.
//
// A cold boot never uses a sandbox made for another actor: its workload
// runs from its first instruction, which could read the wrong name.

// pinnedFile, in a sandbox's bundle or a memory image, holds the
// hostname the guest set itself (so a restore keeps it).
const pinnedFile = "hostname"

// hostnameProgram is the program that sets the hostname to its first
// argument, for this machine's architecture, or nil where there is none:
// then a warm sandbox serves only the actor it was made for.
var hostnameProgram = sethostnameELF(goruntime.GOARCH)

// sethostnameELF returns a static ELF executable for arch that calls
// sethostname(argv[1], strlen(argv[1])) and exits with the call's
// errno (0 on success), or nil for an architecture it has no code for.
func sethostnameELF(arch string) []byte {
	if arch != "amd64" {
		return nil
	}
	// x86-64; at entry the stack holds argc, then argv.
	code := []byte{
		0x48, 0x8b, 0x7c, 0x24, 0x10, // mov  0x10(%rsp), %rdi   ; argv[1]
		0x31, 0xf6, //                   xor  %esi, %esi         ; length
		0x80, 0x3c, 0x37, 0x00, //       1: cmpb $0, (%rdi,%rsi)
		0x74, 0x05, //                   je   2f
		0x48, 0xff, 0xc6, //             inc  %rsi
		0xeb, 0xf5, //                   jmp  1b
		0xb8, 0xaa, 0x00, 0x00, 0x00, // 2: mov $170, %eax       ; sethostname
		0x0f, 0x05, //                   syscall
		0x89, 0xc7, //                   mov  %eax, %edi
		0xf7, 0xdf, //                   neg  %edi               ; -(-errno)
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov  $60, %eax         ; exit
		0x0f, 0x05, //                   syscall
	}
	const base = 0x400000
	hdrs := uint64(binary.Size(elf.Header64{}) + binary.Size(elf.Prog64{}))
	size := hdrs + uint64(len(code))
	var out bytes.Buffer
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Entry: base + hdrs, Phoff: uint64(binary.Size(elf.Header64{})),
		Ehsize: uint16(binary.Size(elf.Header64{})), Phentsize: uint16(binary.Size(elf.Prog64{})), Phnum: 1,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	p := elf.Prog64{
		Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
		Vaddr: base, Paddr: base, Filesz: size, Memsz: size, Align: 0x1000,
	}
	// Writes to a bytes.Buffer do not fail.
	_ = binary.Write(&out, binary.LittleEndian, h)
	_ = binary.Write(&out, binary.LittleEndian, p)
	out.Write(code)
	return out.Bytes()
}

// hostnameProgramPath is where New writes hostnameProgram.
func (r *Runtime) hostnameProgramPath() string {
	return filepath.Join(filepath.Dir(r.slotsDir), "sethostname")
}

// writeHostnameProgram puts hostnameProgram where setHostname runs it from.
func (r *Runtime) writeHostnameProgram() error {
	if hostnameProgram == nil {
		return nil
	}
	return os.WriteFile(r.hostnameProgramPath(), hostnameProgram, 0o755)
}

// canRename says whether this runtime can set a running sandbox's
// hostname.
func canRename() bool { return hostnameProgram != nil }

// setHostname sets the hostname of running sandbox id of slot to name
// and records it pinned.
func (r *Runtime) setHostname(ctx context.Context, slot, id, name string) error {
	prog, err := os.Open(r.hostnameProgramPath())
	if err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	defer prog.Close()
	cmd := r.command(ctx, "exec", "--exec-fd=3", "--user=0:0", "--cap=CAP_SYS_ADMIN", id, "sethostname", name)
	cmd.ExtraFiles = []*os.File{prog}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("set hostname to %q: runsc exec: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	return writePinned(r.bundleDir(slot, id), name)
}

// pinned returns the hostname recorded pinned in dir (a bundle or a
// memory image), or "".
func pinned(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, pinnedFile))
	if err != nil {
		return ""
	}
	return string(b)
}

func writePinned(dir, name string) error {
	if err := os.WriteFile(filepath.Join(dir, pinnedFile), []byte(name), 0o644); err != nil {
		return fmt.Errorf("record the pinned hostname: %w", err)
	}
	return nil
}

// keepPinned carries the pinned hostname of sandbox bundle dir into the
// memory image just taken of it (none: nothing to carry).
func keepPinned(dir, imageDir string) error {
	name := pinned(dir)
	if name == "" {
		return nil
	}
	return writePinned(imageDir, name)
}

// hostnameAfterRestore is what a restore from imageDir, into a sandbox
// whose spec names specHost, of an actor whose hostname is actor must do
// about the hostname: set it (set), or record it pinned because the
// image pins it already (pin).
func hostnameAfterRestore(actor, specHost, imageDir string) (set, pin bool) {
	switch p := pinned(imageDir); {
	case p == "":
		return specHost != actor, false
	case p == actor:
		return false, true
	default:
		// The image keeps another actor's name (a fork): only an
		// exec replaces it.
		return true, false
	}
}

// errNoRename: this runtime cannot set a hostname (no program for the
// architecture).
var errNoRename = errors.New("setting a sandbox's hostname is not supported on " + goruntime.GOARCH)

// nameRestored gives sandbox id of slot, just restored for actor from
// imageDir (none: booted), the actor's hostname when its spec's
// (specHost) and the image's do not, and records it pinned when it is.
func (r *Runtime) nameRestored(ctx context.Context, slot, id, actor, specHost, imageDir string) error {
	if imageDir == "" {
		return nil
	}
	name := hostnameOf(actor)
	set, pin := hostnameAfterRestore(name, specHost, imageDir)
	switch {
	case pin:
		return writePinned(r.bundleDir(slot, id), name)
	case !set:
		return nil
	case !canRename():
		return fmt.Errorf("restore actor %s (hostname %q) in a sandbox named %q: %w", actor, name, specHost, errNoRename)
	}
	began := time.Now()
	if err := r.setHostname(ctx, slot, id, name); err != nil {
		return fmt.Errorf("restore actor %s: %w", actor, err)
	}
	r.log.Debug("hostname set", "slot", slot, "sandbox", id, "hostname", name, "was", specHost, "took", time.Since(began))
	return nil
}
