package options

import "fmt"

// Version is the configuration of `health-router version`.
type Version struct {
	// Output is text (for people) or json.
	Output string
}

// NewVersion returns the parser of `health-router version`.
func NewVersion() *Parser[Version] {
	o := &Version{}
	fs := newFlagSet("version")
	fs.StringVarP(&o.Output, "output", "o", "text", "output: text (for people) or json")
	return newParser(fs, func() (Version, error) {
		if o.Output != "text" && o.Output != "json" {
			return *o, fmt.Errorf("--output %q: want text or json", o.Output)
		}
		return *o, nil
	})
}
