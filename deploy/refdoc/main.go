// Command refdoc writes docs/reference.md from the code's own tables (router/reference): the
// NodePool annotations, the keys the router writes, its Events, every command's flags and its
// metrics. Run it from the module's root.
//
//	go run ./deploy/refdoc           # rewrite docs/reference.md (make docs)
//	go run ./deploy/refdoc -check    # fail if docs/reference.md is stale
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/health-router/health-router/router/reference"
)

func main() {
	check := flag.Bool("check", false, "do not write: fail if "+reference.Path+" differs from what would be written")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: refdoc [-check]")
		os.Exit(2)
	}
	if err := run(reference.Path, *check); err != nil {
		fmt.Fprintln(os.Stderr, "refdoc:", err)
		os.Exit(1)
	}
}

func run(path string, check bool) error {
	want, err := reference.Render()
	if err != nil {
		return err
	}
	current, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if bytes.Equal(current, want) {
		return nil
	}
	if check {
		return fmt.Errorf("%s is stale: run make docs", path)
	}
	return os.WriteFile(path, want, 0o644)
}
