package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// defaultTimeout bounds --wait unless --timeout says otherwise.
const defaultTimeout = 5 * time.Minute

// waitFlags are a verb's --wait (no value) and --timeout DURATION. With
// --wait taking no value, "--wait 2m" makes 2m an argument: an unknown
// command, or worse an object's name; the verb refuses that and names
// --timeout instead.
type waitFlags struct {
	on      bool
	timeout time.Duration
	flags   *pflag.FlagSet
	// argsBefore is how many arguments came before --wait.
	argsBefore int
}

// register adds the flags to cmd; until says what --wait waits for.
func (w *waitFlags) register(cmd *cobra.Command, until string) {
	w.flags = cmd.Flags()
	f := w.flags.VarPF((*waitValue)(w), "wait", "", "wait until "+until+", for at most --timeout")
	f.NoOptDefVal = "true"
	w.flags.DurationVar(&w.timeout, "timeout", defaultTimeout, "how long --wait waits (e.g. --timeout 2m)")
	validate := cmd.Args
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if w.on && w.argsBefore < len(args) {
			if _, err := time.ParseDuration(args[w.argsBefore]); err == nil {
				return fmt.Errorf("%q after --wait: --wait takes no value; the time limit is --timeout %s (to name an object %s, put it before --wait)",
					args[w.argsBefore], args[w.argsBefore], args[w.argsBefore])
			}
		}
		if validate == nil {
			return nil
		}
		return validate(cmd, args)
	}
}

// waitValue is --wait: a boolean that notes where it stood among the
// arguments.
type waitValue waitFlags

func (v *waitValue) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("--wait takes no value; the time limit is --timeout %s", s)
	}
	v.on = on
	v.argsBefore = len(v.flags.Args())
	return nil
}

func (v *waitValue) String() string { return strconv.FormatBool(v.on) }
func (v *waitValue) Type() string   { return "bool" }
