package options

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// envAnnotation marks a flag as having an environment fallback; its value is the variable's
// name, or names (the first is the documented one).
const envAnnotation = "health_router_env"

// A Parser holds one command's flags, bound to its options, and finishes what parsing the
// command line began: Complete fills every flag not given from its environment variable, then
// validates. The command line is parsed into Flags by cobra (cmd/health-router) or by Parse,
// for callers without cobra (tests, the benches).
type Parser[T any] struct {
	Flags  *pflag.FlagSet
	finish func() (T, error)
}

// newFlagSet returns the FlagSet of a command: flags shown in the order they are defined
// (required ones first), no output of its own (errors are returned, help is cobra's).
func newFlagSet(command string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// newParser marks every flag of fs with its environment variable and returns the Parser.
func newParser[T any](fs *pflag.FlagSet, finish func() (T, error)) *Parser[T] {
	fs.VisitAll(func(f *pflag.Flag) {
		names := []string{EnvName(f.Name)}
		if f.Shorthand != "" {
			// -o was the flag's only name before --output: its variable is read too.
			names = append(names, EnvName(f.Shorthand))
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[envAnnotation] = names
	})
	return &Parser[T]{Flags: fs, finish: finish}
}

// Parse parses args, then completes the options.
func (p *Parser[T]) Parse(args []string, getenv func(string) string) (T, error) {
	if err := p.Flags.Parse(args); err != nil {
		var zero T
		return zero, FlagError(p.Flags, err)
	}
	if p.Flags.NArg() > 0 {
		var zero T
		return zero, fmt.Errorf("unexpected argument %q", p.Flags.Arg(0))
	}
	return p.Complete(getenv)
}

// Complete fills every flag not given on the command line from its environment variable, then
// validates the options.
func (p *Parser[T]) Complete(getenv func(string) string) (T, error) {
	var err error
	p.Flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		for _, name := range EnvNames(f) {
			v := getenv(name)
			if v == "" {
				continue
			}
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q (for --%s): %s", name, v, f.Name, want(f, e))
			}
			return
		}
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return p.finish()
}

// EnvNames returns the environment variables a flag falls back to, the documented one first;
// none for a flag that is not one of the commands' own (cobra's --help).
func EnvNames(f *pflag.Flag) []string {
	return f.Annotations[envAnnotation]
}

// FlagError rewrites an error of fs.Parse as one line that names the flag and says what it
// wants: `--visibility-timeout "soon": want a duration such as 30s`, and for an unknown flag
// the one meant, when a flag of fs is close; a long name given one dash (-queue-url, which
// pflag reads as the shorthands q, u, e...) is told as such.
func FlagError(fs *pflag.FlagSet, err error) error {
	var invalid *pflag.InvalidValueError
	var unknown *pflag.NotExistError
	var missing *pflag.ValueRequiredError
	switch {
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return fmt.Errorf("%s %q: %s", dashed(f), invalid.GetValue(), want(f, invalid.Unwrap()))
	case errors.As(err, &missing):
		return fmt.Errorf("%s needs a value", dashed(missing.GetFlag()))
	case errors.As(err, &unknown) && unknown.GetSpecifiedShortnames() == "":
		name := unknown.GetSpecifiedName()
		if s := suggest(fs, name); s != "" {
			return fmt.Errorf("unknown flag --%s (did you mean --%s?)", name, s)
		}
		return fmt.Errorf("unknown flag --%s", name)
	case errors.As(err, &unknown):
		group, _, _ := strings.Cut(unknown.GetSpecifiedShortnames(), "=")
		switch {
		case len(group) > 1 && fs.Lookup(group) != nil:
			return fmt.Errorf("unknown flag -%s (did you mean --%s?)", group, group)
		case len(group) > 1:
			if s := suggest(fs, group); s != "" {
				return fmt.Errorf("unknown flag -%s (did you mean --%s?)", group, s)
			}
			return fmt.Errorf("unknown flag -%s (a long flag takes two dashes)", group)
		case group == "v" && fs.Lookup("version") != nil:
			// kubectl's -v is its log verbosity: -v is not taken as --version either.
			return fmt.Errorf("unknown flag -v (did you mean --version?)")
		}
		return fmt.Errorf("unknown flag -%s", unknown.GetSpecifiedName())
	}
	return err
}

// dashed writes a flag as it is typed: --queue-url, -o/--output.
func dashed(f *pflag.Flag) string {
	if f.Shorthand != "" {
		return "-" + f.Shorthand + "/--" + f.Name
	}
	return "--" + f.Name
}

// want says what a flag's value should have been, by its type; a flag of its own type (a
// list of sender IDs) says it in its error.
func want(f *pflag.Flag, err error) string {
	switch f.Value.Type() {
	case "duration":
		return "want a duration such as 30s, 2m or 1h30m"
	case "int":
		return "want a whole number"
	case "float64":
		return "want a number"
	case "bool":
		return "want true or false"
	}
	return err.Error()
}

// suggest returns the flag of fs closest to name: one it begins, or one at most two edits
// away (a typo); "" when none is.
func suggest(fs *pflag.FlagSet, name string) string {
	best, bestDist := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := distance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = 0
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// Default writes a flag's default as people write it (2m, not 2m0s); "" when the default is
// the zero value, which says nothing.
func Default(f *pflag.Flag) string {
	v := f.DefValue
	switch v {
	case "", "0", "false", "0s", "[]":
		return ""
	}
	if f.Value.Type() == "duration" {
		if strings.HasSuffix(v, "m0s") {
			v = strings.TrimSuffix(v, "0s")
		}
		if strings.HasSuffix(v, "h0m") {
			v = strings.TrimSuffix(v, "0m")
		}
	}
	return v
}
