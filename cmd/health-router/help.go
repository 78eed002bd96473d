package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/health-router/health-router/router/options"
)

// helpWidth is the width help is wrapped at: a terminal's default.
const helpWidth = 80

// writeHelp writes a command's help on stdout: what it does, then its usage.
func writeHelp(cmd *cobra.Command, _ []string) {
	w := cmd.OutOrStdout()
	text := cmd.Long
	if text == "" {
		text = cmd.Short + "."
	}
	fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(text))
	_ = writeUsage(w, cmd) // a write to stdout that fails has no one to tell
}

// writeUsage writes how to call cmd: the usage line, examples, commands, and every flag with
// its default and environment variable.
func writeUsage(w io.Writer, cmd *cobra.Command) error {
	var b strings.Builder
	b.WriteString("Usage:\n")
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(&b, "  %s <command> [flags]\n", cmd.CommandPath())
	} else {
		fmt.Fprintf(&b, "  %s\n", cmd.UseLine())
	}
	if cmd.HasExample() {
		fmt.Fprintf(&b, "\nExamples:\n%s\n", strings.TrimRight(cmd.Example, "\n"))
	}
	if cmd.HasAvailableSubCommands() {
		b.WriteString("\nCommands:\n")
		cmds := slices.Clone(cmd.Commands())
		slices.SortStableFunc(cmds, func(a, b *cobra.Command) int { return rank(a) - rank(b) })
		for _, c := range cmds {
			if c.IsAvailableCommand() {
				fmt.Fprintf(&b, "  %-*s %s\n", cmd.NamePadding(), c.Name(), c.Short)
			}
		}
	}
	if flags := cmd.LocalFlags(); flags.HasAvailableFlags() {
		b.WriteString("\nFlags:\n")
		writeFlags(&b, flags)
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(&b, "\nRun '%s <command> --help' for a command's flags and examples.\n", cmd.CommandPath())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFlags writes each flag on a line of its own, as typed, and under it what it does,
// wrapped, ending with its default and its environment variable.
func writeFlags(b *strings.Builder, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		varname, usage := pflag.UnquoteUsage(f)
		name := "    --" + f.Name
		if f.Shorthand != "" {
			name = "-" + f.Shorthand + ", --" + f.Name
		}
		if varname != "" {
			name += " " + varname
		}
		fmt.Fprintf(b, "  %s\n", name)
		words := strings.Fields(usage)
		if d := options.Default(f); d != "" {
			words = append(words, "(default", d+")")
		}
		if names := options.EnvNames(f); len(names) > 0 {
			words = append(words, "(env "+names[0]+")") // one word: the name stays with "env"
		}
		for _, line := range wrap(words, helpWidth-8) {
			fmt.Fprintf(b, "        %s\n", line)
		}
	})
}

// rank is a command's place in commandOrder; the others (help, completion) come after.
func rank(c *cobra.Command) int {
	if i := slices.Index(commandOrder, c.Name()); i >= 0 {
		return i
	}
	return len(commandOrder)
}

// wrap joins words into lines of at most width characters; a word longer than width has a
// line of its own.
func wrap(words []string, width int) []string {
	var lines []string
	line := ""
	for _, word := range words {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
