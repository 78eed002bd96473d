// Command admission writes the chart's ValidatingAdmissionPolicy for NodePool annotations
// (templates/admission-nodepools.yaml) from router/policy: the keys are the router's annotation
// table (policy.Annotations), the bounds its constants, the reboot-in-place types its
// RebootsInPlace. A key the table gains without a rule here is an error, so that the API server
// and the router's parser cannot drift apart; test/deploy runs the router's example values
// through both and checks that they agree.
//
//	go run ./deploy/admission deploy/charts/health-router           # rewrite the template
//	go run ./deploy/admission -check deploy/charts/health-router    # fail if it is stale
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// templateFile is the generated template, under the chart's directory.
const templateFile = "templates/admission-nodepools.yaml"

func main() {
	check := flag.Bool("check", false, "do not write: fail if the template differs from what would be written")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: admission [-check] <chart directory>")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *check); err != nil {
		fmt.Fprintln(os.Stderr, "admission:", err)
		os.Exit(1)
	}
}

func run(chart string, check bool) error {
	out, err := Template()
	if err != nil {
		return err
	}
	path := filepath.Join(chart, templateFile)
	if check {
		cur, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Equal(cur, out) {
			return fmt.Errorf("%s is stale: run go run ./deploy/admission %s", path, chart)
		}
		return nil
	}
	return os.WriteFile(path, out, 0o644)
}
