package gvisor

import (
	"bytes"
	"debug/elf"
	"testing"
)

// The program is a well-formed static executable whose entry point is
// its code, loaded readable and executable.
func TestSethostnameELF(t *testing.T) {
	if sethostnameELF("arm64") != nil {
		t.Fatal("a program for arm64, which has no code here")
	}
	prog := sethostnameELF("amd64")
	f, err := elf.NewFile(bytes.NewReader(prog))
	if err != nil {
		t.Fatal(err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Fatalf("class %v machine %v type %v", f.Class, f.Machine, f.Type)
	}
	if len(f.Progs) != 1 {
		t.Fatalf("%d program headers, want 1", len(f.Progs))
	}
	p := f.Progs[0]
	if p.Type != elf.PT_LOAD || p.Flags != elf.PF_R|elf.PF_X || p.Off != 0 || p.Filesz != uint64(len(prog)) {
		t.Fatalf("segment %+v", p.ProgHeader)
	}
	if f.Entry <= p.Vaddr || f.Entry >= p.Vaddr+p.Memsz {
		t.Fatalf("entry %#x outside the segment [%#x, %#x)", f.Entry, p.Vaddr, p.Vaddr+p.Memsz)
	}
}

func TestHostnameAfterRestore(t *testing.T) {
	plain, pinnedA := t.TempDir(), t.TempDir()
	if err := writePinned(pinnedA, "a"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, actor, specHost, image string
		set, pin                     bool
	}{
		{"sandbox made for the actor", "a", "a", plain, false, false},
		{"sandbox made for another actor", "a", "b", plain, true, false},
		{"sandbox made for no actor", "a", "", plain, true, false},
		{"image pins the actor's name", "a", "b", pinnedA, false, true},
		{"image pins it, own sandbox", "a", "a", pinnedA, false, true},
		{"image pins another actor's name (a fork)", "c", "c", pinnedA, true, false},
		{"golden build", "", "", plain, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, pin := hostnameAfterRestore(tt.actor, tt.specHost, tt.image)
			if set != tt.set || pin != tt.pin {
				t.Fatalf("set, pin = %v, %v; want %v, %v", set, pin, tt.set, tt.pin)
			}
		})
	}
}
