package validate

import (
	"strings"
	"testing"
)

func TestTemplateRef(t *testing.T) {
	tests := []struct {
		ref     string
		name    string
		rev     int64
		wantErr string
	}{
		{"counter", "counter", 0, ""},
		{"counter@3", "counter", 3, ""},
		{RevisionName("counter", 12), "counter", 12, ""},
		{"counter@0", "", 0, "a number from 1"},
		{"counter@x", "", 0, "a number from 1"},
		{"counter@", "", 0, "a number from 1"},
		{"Counter@1", "", 0, "DNS-1123"},
		{"@1", "", 0, "required"},
	}
	for _, tt := range tests {
		name, rev, err := TemplateRef("--template", tt.ref)
		switch {
		case tt.wantErr == "" && (err != nil || name != tt.name || rev != tt.rev):
			t.Errorf("TemplateRef(%q) = %q, %d, %v; want %q, %d", tt.ref, name, rev, err, tt.name, tt.rev)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("TemplateRef(%q) error %v, want one mentioning %q", tt.ref, err, tt.wantErr)
		}
	}
	if got := TemplateOfRevision("counter@2"); got != "counter" {
		t.Errorf("TemplateOfRevision = %q", got)
	}
}
