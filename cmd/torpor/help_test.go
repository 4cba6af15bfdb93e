package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
)

// commandTree is the whole torpor command tree, as main builds it.
func commandTree() *cobra.Command {
	root := cli.NewRoot()
	root.AddCommand(newVersionCommand())
	addProcessCommands(root)
	return root
}

func eachCommand(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		eachCommand(sub, fn)
	}
}

// TestEveryCommandHasAnExample: every command's help shows an example,
// and every example line is a command line this tree takes: its command
// path exists and its flags parse.
func TestEveryCommandHasAnExample(t *testing.T) {
	eachCommand(commandTree(), func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s: no example in its help", c.CommandPath())
			return
		}
		for _, line := range exampleLines(c.Example) {
			words, err := shellWords(line)
			if err != nil || len(words) == 0 || words[0] != "torpor" {
				t.Errorf("%s: example %q: not a torpor command line (%v)", c.CommandPath(), line, err)
				continue
			}
			fresh := commandTree() // flags parsed into a tree of its own
			target, args, err := fresh.Find(words[1:])
			if err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				continue
			}
			if err := target.ParseFlags(args); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
			}
		}
	})
}

// TestHelpNamesOnlyCommandsThatExist: help texts that name a verb other
// tools have (kubectl's drain, cordon) have such a command too. A flag
// named after one (--drain-timeout) is no such verb.
func TestHelpNamesOnlyCommandsThatExist(t *testing.T) {
	root := commandTree()
	names := map[string]bool{}
	eachCommand(root, func(c *cobra.Command) { names[c.Name()] = true })
	eachCommand(root, func(c *cobra.Command) {
		for _, verb := range []string{"drain", "cordon", "uncordon"} {
			if regexp.MustCompile(`(^|[^\w-])`+verb+`([^\w-]|$)`).MatchString(c.Long+c.Short+c.Example) && !names[verb] {
				t.Errorf("%s --help names %q, which is no torpor command", c.CommandPath(), verb)
			}
		}
	})
}

// exampleLines are the command lines of an example: comments dropped,
// lines continued with a backslash joined.
func exampleLines(example string) []string {
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(example, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if before, ok := strings.CutSuffix(l, `\`); ok {
			cur.WriteString(before + " ")
			continue
		}
		cur.WriteString(l)
		line := cur.String()
		cur.Reset()
		// A pipeline's first command is the example's.
		if i := strings.Index(line, " | "); i >= 0 {
			lines = append(lines, line[:i], strings.TrimSpace(line[i+3:]))
			continue
		}
		lines = append(lines, line)
	}
	return lines
}

// shellWords splits a command line as a POSIX shell would, for quotes.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		switch ch := line[i]; {
		case ch == '\'' || ch == '"':
			end := strings.IndexByte(line[i+1:], ch)
			if end < 0 {
				return nil, errUnterminated
			}
			cur.WriteString(line[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

var errUnterminated = errors.New("unterminated quote")
