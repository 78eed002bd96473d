// Package gobuild builds the health-router binary as every published artifact carries it: the
// image's (deploy/image) and the release's CLI archives (deploy/release) come from this one
// command line, so a linux binary in an archive is byte for byte the image's.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
)

// Args are the arguments of `go build` for a published binary: static, no paths of the build
// machine (-trimpath), no VCS stamp or build ID that would vary between two builds of one
// commit, symbols stripped; stamp is more linker flags: the version and the commit, which
// `health-router version` and health_router_build_info report (router/version.LDFlags).
func Args(stamp string) []string {
	return []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid= " + stamp}
}

// Build builds the main package pkg for goos/goarch into out, with CGO off, its output on
// stderr; stamp as in Args.
func Build(pkg, goos, goarch, out, stamp string) error {
	args := append(Args(stamp), "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w", pkg, goos, goarch, err)
	}
	return nil
}
