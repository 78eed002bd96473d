// Package version says which build of health-router is running: its version and commit, set
// when it is linked (make build and deploy/image pass LDFlags) or else read from what Go
// records in every binary, and the Go and Karpenter versions it was built with.
package version

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set by the linker (LDFlags): the only way to give a binary a value
// at build time, hence package variables, never written by the code.
var (
	version string
	commit  string
)

// Package is this package's import path, as -ldflags -X names its variables.
const Package = "github.com/health-router/health-router/router/version"

// KarpenterModule is the module of the Karpenter API (NodePool, NodeClaim) the router reads;
// Info reports the version the binary is built with.
const KarpenterModule = "sigs.k8s.io/karpenter"

// Unknown stands for a value the build did not record (a binary built with -buildvcs=false
// and no LDFlags).
const Unknown = "unknown"

// LDFlags returns the linker flags that stamp a version and a commit into the binary:
// go build -ldflags "$(LDFlags)".
func LDFlags(version, commit string) string {
	return fmt.Sprintf("-X %s.version=%s -X %s.commit=%s", Package, version, Package, commit)
}

// Info is what `health-router version` prints, and the labels of health_router_build_info.
type Info struct {
	Version          string `json:"version"`
	Commit           string `json:"commit"`
	GoVersion        string `json:"go_version"`
	KarpenterVersion string `json:"karpenter_version"`
	Platform         string `json:"platform"`
}

// Get returns the running binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuild(version, commit, bi)
}

// fromBuild makes the Info of a binary linked with version and commit (either may be empty)
// whose build information is bi (nil when the binary has none).
func fromBuild(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		// The main module's version: the tag (or a pseudo-version) go build reads from git,
		// +dirty for uncommitted changes; "(devel)" when it could not.
		info.Version = cmp.Or(info.Version, bi.Main.Version)
		var revision, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if info.Commit == "" && revision != "" {
			info.Commit = revision
			if modified == "true" {
				info.Commit += "-dirty"
			}
		}
		for _, d := range bi.Deps {
			if d.Path != KarpenterModule {
				continue
			}
			if d.Replace != nil && d.Replace.Version != "" {
				d = d.Replace
			}
			info.KarpenterVersion = d.Version
		}
	}
	info.Version = cmp.Or(info.Version, "(devel)")
	info.Commit = cmp.Or(info.Commit, Unknown)
	info.KarpenterVersion = cmp.Or(info.KarpenterVersion, Unknown)
	return info
}

// WriteText writes i for people, a field a line.
func (i Info) WriteText(w io.Writer) error {
	_, err := fmt.Fprintf(w, "version:    %s\ncommit:     %s\ngo:         %s\nkarpenter:  %s (%s)\nplatform:   %s\n",
		i.Version, i.Commit, i.GoVersion, i.KarpenterVersion, KarpenterModule, i.Platform)
	return err
}

// WriteJSON writes i as one JSON object.
func (i Info) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(i)
}
