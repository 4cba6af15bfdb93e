// Package flagconfig fills the flags the command line left unset from the
// environment, then from a YAML config file, so every setting of a process
// role has one name in three places: --listen, TORPOR_LISTEN and listen:.
// It walks the flag set, so a flag added later gets both without a line
// here.
package flagconfig

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Prefix starts every environment variable.
const Prefix = "TORPOR_"

// ConfigFlag names the config file; TORPOR_CONFIG when it is not given.
const ConfigFlag = "config"

// fileSuffix marks an environment variable or config key whose value is a
// file holding the setting (a secret kept out of the process's arguments
// and environment).
const fileSuffix = "_FILE"

// EnvName is the environment variable of flag name: TORPOR_ and the name
// in upper snake case (--heartbeat-timeout: TORPOR_HEARTBEAT_TIMEOUT).
func EnvName(name string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Bound reports whether a flag takes part: all but help, version and the
// config file's own.
func Bound(f *pflag.Flag) bool {
	return f.Name != "help" && f.Name != "version" && f.Name != ConfigFlag
}

// alternativesKey annotates the flags of one setting given several ways
// (--ca or --ca-fingerprint) with the names of all of them.
const alternativesKey = "flagconfig_alternatives"

// Alternatives marks the flags names of fs as ways to give one setting:
// Apply takes the one from the strongest source (the command line, then
// the environment, then the config file), ignores the others' weaker
// sources, and refuses two from the same source, naming both as the user
// gave them.
func Alternatives(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		if err := fs.SetAnnotation(name, alternativesKey, names); err != nil {
			panic(err) // a flag this program's code names: a bug
		}
	}
}

// AlternativesOf is the group of Alternatives f is one of, nil if none.
func AlternativesOf(f *pflag.Flag) []string {
	return f.Annotations[alternativesKey]
}

// Apply sets each flag of fs that the command line did not from, in this
// order, its environment variable, the file its _FILE variable names, or
// the config file (the --config flag's, else $TORPOR_CONFIG's). In the
// config file, keys are flag names; a key naming command holds keys read
// by that command only, which win over the top-level ones; keys naming
// the other commands are left to them. Flags marked as Alternatives take
// one value between them. lookup is os.LookupEnv in production.
func Apply(fs *pflag.FlagSet, command string, commands []string, lookup func(string) (string, bool)) error {
	fromFile, err := readConfig(fs, command, commands, lookup)
	if err != nil {
		return err
	}
	sources := map[string]source{}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if !Bound(f) {
			return
		}
		s, err := sourceOf(fs, f, lookup, fromFile)
		if err != nil {
			errs = append(errs, err)
			return
		}
		sources[f.Name] = s
	})
	errs = append(errs, settleAlternatives(fs, sources))
	fs.VisitAll(func(f *pflag.Flag) {
		if s, ok := sources[f.Name]; ok && s.strength > fromCommandLine && s.strength < fromNowhere {
			errs = append(errs, s.apply(fs, f))
		}
	})
	return errors.Join(errs...)
}

// strength orders where a setting comes from, strongest first.
type strength int

const (
	fromCommandLine strength = iota
	fromEnvironment
	fromConfigFile
	fromNowhere
)

// source is where one flag's value comes from: where names it for
// errors, values are its arguments (read is set instead when they are in
// a file, read only if the value is used).
type source struct {
	strength strength
	where    string
	values   []string
	read     func() (string, error)
}

func (s source) apply(fs *pflag.FlagSet, f *pflag.Flag) error {
	values := s.values
	if s.read != nil {
		secret, err := s.read()
		if err != nil {
			return fmt.Errorf("%s: %w", s.where, err)
		}
		values = splitList(f, secret)
	}
	return setValues(fs, f, values, s.where)
}

// sourceOf is where f's value comes from, if anywhere.
func sourceOf(fs *pflag.FlagSet, f *pflag.Flag, lookup func(string) (string, bool), fromFile map[string]setting) (source, error) {
	if f.Changed {
		return source{strength: fromCommandLine, where: "--" + f.Name}, nil
	}
	env := EnvName(f.Name)
	value, inEnv := lookup(env)
	path, inFile := lookup(env + fileSuffix)
	if fs.Lookup(f.Name+"-file") != nil {
		inFile = false // TORPOR_X_FILE is --x-file's own variable
	}
	switch {
	case inEnv && inFile:
		return source{}, fmt.Errorf("%s and %s%s: give one", env, env, fileSuffix)
	case inEnv:
		return source{strength: fromEnvironment, where: env, values: splitList(f, value)}, nil
	case inFile:
		return source{strength: fromEnvironment, where: env + fileSuffix + " " + path, read: func() (string, error) { return readSecret(path) }}, nil
	}
	s, ok := fromFile[f.Name]
	switch {
	case !ok:
		return source{strength: fromNowhere}, nil
	case s.fromFile:
		return source{strength: fromConfigFile, where: s.where, read: func() (string, error) { return readSecret(s.values[0]) }}, nil
	}
	return source{strength: fromConfigFile, where: s.where, values: s.values}, nil
}

// settleAlternatives leaves, of each group of Alternatives, only the
// sources of the strongest kind present, and refuses two of them.
func settleAlternatives(fs *pflag.FlagSet, sources map[string]source) error {
	var errs []error
	seen := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		group := AlternativesOf(f)
		if len(group) == 0 || seen[group[0]] {
			return
		}
		seen[group[0]] = true
		strongest := fromNowhere
		for _, name := range group {
			strongest = min(strongest, sources[name].strength)
		}
		var given []string
		for _, name := range group {
			if s := sources[name]; s.strength == strongest && strongest < fromNowhere {
				given = append(given, s.where)
			} else {
				sources[name] = source{strength: fromNowhere}
			}
		}
		if len(given) > 1 {
			errs = append(errs, fmt.Errorf("%s: give one (they are one setting)", strings.Join(given, " and ")))
		}
	})
	return errors.Join(errs...)
}

// splitList splits a list flag's value at commas; others keep it whole.
func splitList(f *pflag.Flag, value string) []string {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return strings.Split(value, ",")
	}
	return []string{value}
}

// setValues sets f as the command line would, once per value (list flags
// append), naming where the values came from when one is refused.
func setValues(fs *pflag.FlagSet, f *pflag.Flag, values []string, where string) error {
	for _, v := range values {
		if err := fs.Set(f.Name, v); err != nil {
			return fmt.Errorf("%s: %q is not a valid --%s: %w", where, v, f.Name, err)
		}
	}
	return nil
}

func readSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

// setting is one config file key: its values, as list flags take them one
// by one, and where it was, for errors.
type setting struct {
	values []string
	where  string
	// fromFile: the key was NAME-file, values[0] the file holding NAME.
	fromFile bool
}

// readConfig reads the config file, if one is named, into its settings
// for command, refusing keys that are not flags of fs.
func readConfig(fs *pflag.FlagSet, command string, commands []string, lookup func(string) (string, bool)) (map[string]setting, error) {
	path := ""
	if f := fs.Lookup(ConfigFlag); f != nil {
		path = f.Value.String()
	}
	if path == "" {
		path, _ = lookup(EnvName(ConfigFlag))
	}
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s:%d: want a mapping of setting names to values", path, root.Line)
	}
	settings := map[string]setting{}
	var section *yaml.Node
	if err := readMapping(fs, path, root, command, commands, settings, &section); err != nil {
		return nil, err
	}
	if section != nil {
		if section.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("config file %s:%d: %s: want a mapping of setting names to values", path, section.Line, command)
		}
		if err := readMapping(fs, path, section, "", nil, settings, nil); err != nil {
			return nil, err
		}
	}
	return settings, nil
}

// readMapping adds the keys of m to settings. At the top level (section
// not nil) a key naming a command is a section: command's is returned in
// section, the others' are skipped.
func readMapping(fs *pflag.FlagSet, path string, m *yaml.Node, command string, commands []string, settings map[string]setting, section **yaml.Node) error {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		where := fmt.Sprintf("config file %s:%d: %s", path, k.Line, k.Value)
		if section != nil && slices.Contains(commands, k.Value) && v.Kind == yaml.MappingNode {
			if k.Value == command {
				*section = v
			}
			continue
		}
		name, fromFile := k.Value, false
		f := fs.Lookup(name)
		if f == nil {
			if base, ok := strings.CutSuffix(name, "-file"); ok {
				name, fromFile, f = base, true, fs.Lookup(base)
			}
		}
		if f == nil || !Bound(f) {
			return fmt.Errorf("%s: unknown setting (not a flag of torpor %s)", where, fs.Name())
		}
		values, err := nodeValues(v)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if fromFile && len(values) != 1 {
			return fmt.Errorf("%s: want the path of one file", where)
		}
		settings[name] = setting{values: values, where: where, fromFile: fromFile}
	}
	return nil
}

// nodeValues is a value as flag arguments: a scalar as written, a list's
// items one by one, a mapping's entries as KEY=VALUE.
func nodeValues(v *yaml.Node) ([]string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		return []string{v.Value}, nil
	case yaml.SequenceNode:
		var out []string
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: want a list of plain values", item.Line)
			}
			out = append(out, item.Value)
		}
		return out, nil
	case yaml.MappingNode:
		var out []string
		for i := 0; i+1 < len(v.Content); i += 2 {
			if v.Content[i+1].Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: want KEY: VALUE pairs of plain values", v.Content[i].Line)
			}
			out = append(out, v.Content[i].Value+"="+v.Content[i+1].Value)
		}
		return out, nil
	}
	return nil, fmt.Errorf("line %d: want a value, a list or a mapping", v.Line)
}

// markdownEscaper keeps usage text literal in a table cell: | would end
// the cell, <name> would read as an HTML tag.
var markdownEscaper = strings.NewReplacer("|", `\|`, "<", `\<`)

// Command is a command's name and flags, for Reference.
type Command struct {
	Name  string
	Flags *pflag.FlagSet
}

// Reference writes the Markdown table of every bound flag of cmds: its
// environment variable, config key, default and usage.
func Reference(cmds []Command) string {
	var b strings.Builder
	b.WriteString("| command | flag | environment | config key | default | meaning |\n|---|---|---|---|---|---|\n")
	for _, c := range cmds {
		c.Flags.VisitAll(func(f *pflag.Flag) {
			if !Bound(f) {
				return
			}
			def := f.DefValue
			if def == "" || def == "[]" {
				def = " "
			} else {
				def = "`" + def + "`"
			}
			usage := f.Usage
			if alts := AlternativesOf(f); len(alts) > 0 {
				usage += " (one setting with --" + strings.Join(slices.DeleteFunc(slices.Clone(alts), func(n string) bool { return n == f.Name }), ", --") +
					": the strongest source of the two wins, a flag over a variable over the config file)"
			}
			fmt.Fprintf(&b, "| %s | `--%s` | `%s` | `%s` | %s | %s |\n", c.Name, f.Name, EnvName(f.Name), f.Name, def,
				markdownEscaper.Replace(usage))
		})
	}
	return b.String()
}
