package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/flagconfig"
)

var update = flag.Bool("update", false, "rewrite the settings table in docs/operations.md")

// samples are a valid value of each flag type; one of a new type must be
// added here, so every flag is shown to take its variable.
var samples = map[string]string{
	"string": "sample", "bool": "false", "duration": "3m7s", "int": "7",
	"stringSlice": "sample", "stringArray": "sample", "stringToInt": "sample=7", "stringToString": "sample=v",
}

// processFlags are the bound flags of each process command of a fresh
// command tree.
func processFlags(t *testing.T) []*cobra.Command {
	t.Helper()
	cmds := addProcessCommands(cli.NewRoot())
	if len(cmds) < 4 {
		t.Fatalf("%d process commands, want server, node, router and up at least", len(cmds))
	}
	return cmds
}

func boundFlags(cmd *cobra.Command) []*pflag.Flag {
	var out []*pflag.Flag
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if flagconfig.Bound(f) {
			out = append(out, f)
		}
	})
	return out
}

// TestEveryFlagHasItsEnvironmentVariable: every flag of every process
// command takes its value from TORPOR_<FLAG>, and from its key in the
// config file, however it was added. Alternatives (one setting, several
// flags) take turns: round r sets the r-th of each.
func TestEveryFlagHasItsEnvironmentVariable(t *testing.T) {
	for _, cmd := range processFlags(t) {
		rounds := 1
		for _, f := range boundFlags(cmd) {
			rounds = max(rounds, len(flagconfig.AlternativesOf(f)))
		}
		for round := range rounds {
			t.Run(fmt.Sprintf("%s/%d", cmd.Name(), round), func(t *testing.T) { flagsFromTheirSources(t, cmd.Name(), round) })
		}
	}
}

func flagsFromTheirSources(t *testing.T, command string, round int) {
	env := map[string]string{}
	var yaml strings.Builder
	var taking []string
	for _, f := range boundFlags(find(t, processFlags(t), command)) {
		if alts := flagconfig.AlternativesOf(f); len(alts) > 0 && slices.Index(alts, f.Name) != round%len(alts) {
			continue
		}
		sample, ok := samples[f.Value.Type()]
		if !ok {
			t.Fatalf("--%s is of type %s, which the test has no sample for", f.Name, f.Value.Type())
		}
		taking = append(taking, f.Name)
		env[flagconfig.EnvName(f.Name)] = sample
		fmt.Fprintf(&yaml, "%s: %q\n", f.Name, sample)
	}
	check := func(source string, cmd *cobra.Command) {
		for _, name := range taking {
			f := cmd.LocalFlags().Lookup(name)
			if !f.Changed || !strings.Contains(f.Value.String(), strings.Split(samples[f.Value.Type()], "=")[0]) {
				t.Errorf("--%s from %s: changed %v, value %q", f.Name, source, f.Changed, f.Value.String())
			}
		}
	}
	fromEnv := find(t, processFlags(t), command)
	if err := flagconfig.Apply(fromEnv.LocalFlags(), command, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	check("the environment", fromEnv)

	file := filepath.Join(t.TempDir(), "torpor.yaml")
	if err := os.WriteFile(file, []byte(yaml.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := find(t, processFlags(t), command)
	if err := fromFile.LocalFlags().Set(flagconfig.ConfigFlag, file); err != nil {
		t.Fatal(err)
	}
	if err := flagconfig.Apply(fromFile.LocalFlags(), command, nil, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	check("the config file", fromFile)
}

func find(t *testing.T, cmds []*cobra.Command, name string) *cobra.Command {
	t.Helper()
	for _, c := range cmds {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no command %s", name)
	return nil
}

// TestSettingsThroughTheCommand: a process command reads its settings as
// it runs: here router's bad --park-timeout from the environment and a
// config file's unknown key fail before anything starts, naming them.
func TestSettingsThroughTheCommand(t *testing.T) {
	run := func(args ...string) string {
		root := cli.NewRoot()
		addProcessCommands(root)
		var stderr strings.Builder
		root.SetErr(&stderr)
		root.SetOut(&stderr)
		if code := cli.Execute(t.Context(), root, args); code != 1 {
			t.Fatalf("torpor %v: exit %d, want 1", args, code)
		}
		return stderr.String()
	}
	t.Setenv("TORPOR_PARK_TIMEOUT", "forever")
	if msg := run("router"); !strings.Contains(msg, "TORPOR_PARK_TIMEOUT") {
		t.Errorf("bad environment variable: %q", msg)
	}
	t.Setenv("TORPOR_PARK_TIMEOUT", "")
	os.Unsetenv("TORPOR_PARK_TIMEOUT")
	file := filepath.Join(t.TempDir(), "torpor.yaml")
	if err := os.WriteFile(file, []byte("server:\n  store: sqlite:x\nrouter:\n  sever: https://typo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TORPOR_CONFIG", file)
	if msg := run("router"); !strings.Contains(msg, file+":4: sever: unknown setting") {
		t.Errorf("unknown key in the router's section: %q", msg)
	}
}

// TestSettingsReference: docs/operations.md's table of settings is the
// one the flags make (go test ./cmd/torpor -run TestSettingsReference
// -update rewrites it).
func TestSettingsReference(t *testing.T) {
	var cmds []flagconfig.Command
	for _, c := range processFlags(t) {
		cmds = append(cmds, flagconfig.Command{Name: c.Name(), Flags: c.LocalFlags()})
	}
	// The node's and router's names default to this machine's.
	table := strings.ReplaceAll(flagconfig.Reference(cmds), "`"+defaultNodeName()+"`", "the host name")
	const (
		path  = "../../docs/operations.md"
		begin = "<!-- settings table: go test ./cmd/torpor -run TestSettingsReference -update -->\n"
		end   = "<!-- end of settings table -->\n"
	)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	before, rest, ok1 := strings.Cut(doc, begin)
	current, after, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("%s has no settings table between %q and %q", path, begin, end)
	}
	if current == table {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(before+begin+table+end+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's settings table is out of date: go test ./cmd/torpor -run TestSettingsReference -update", path)
}
