package version

import (
	"bytes"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuild(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/health-router/health-router", Version: "v0.3.1-0.20260101120000-0123456789ab+dirty"},
		Deps: []*debug.Module{
			{Path: "sigs.k8s.io/controller-runtime", Version: "v0.24.1"},
			{Path: KarpenterModule, Version: "v1.15.0"},
		},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}},
	}
	for _, tt := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{name: "linked with a version and a commit: they win", version: "v0.3.0", commit: "feedface", bi: bi,
			want: Info{Version: "v0.3.0", Commit: "feedface", KarpenterVersion: "v1.15.0"}},
		{name: "no LDFlags: what go build recorded", bi: bi,
			want: Info{Version: "v0.3.1-0.20260101120000-0123456789ab+dirty", Commit: "0123456789abcdef-dirty", KarpenterVersion: "v1.15.0"}},
		{name: "no vcs information (-buildvcs=false), no LDFlags",
			bi:   &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Deps: []*debug.Module{{Path: KarpenterModule, Version: "v1.15.0", Replace: &debug.Module{Path: "../karpenter", Version: ""}}}},
			want: Info{Version: "(devel)", Commit: Unknown, KarpenterVersion: "v1.15.0"}},
		{name: "Karpenter replaced by another version",
			bi:   &debug.BuildInfo{Deps: []*debug.Module{{Path: KarpenterModule, Version: "v1.15.0", Replace: &debug.Module{Path: "example.com/fork/karpenter", Version: "v1.15.1-fix"}}}},
			want: Info{Version: "(devel)", Commit: Unknown, KarpenterVersion: "v1.15.1-fix"}},
		{name: "no build information", want: Info{Version: "(devel)", Commit: Unknown, KarpenterVersion: Unknown}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.GoVersion, tt.want.Platform = runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
			if got := fromBuild(tt.version, tt.commit, tt.bi); got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestWrite(t *testing.T) {
	i := Info{Version: "v0.3.0", Commit: "feedface", GoVersion: "go1.26.10", KarpenterVersion: "v1.15.0", Platform: "linux/arm64"}
	var text bytes.Buffer
	if err := i.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	want := "version:    v0.3.0\ncommit:     feedface\ngo:         go1.26.10\nkarpenter:  v1.15.0 (sigs.k8s.io/karpenter)\nplatform:   linux/arm64\n"
	if text.String() != want {
		t.Errorf("text:\n%s\nwant:\n%s", text.String(), want)
	}
	var js bytes.Buffer
	if err := i.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	for k, v := range map[string]string{"version": "v0.3.0", "commit": "feedface", "go_version": "go1.26.10", "karpenter_version": "v1.15.0", "platform": "linux/arm64"} {
		if got[k] != v {
			t.Errorf("json %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestLDFlags(t *testing.T) {
	got := LDFlags("v1.2.3", "abc")
	want := "-X github.com/health-router/health-router/router/version.version=v1.2.3 -X github.com/health-router/health-router/router/version.commit=abc"
	if got != want || !strings.HasPrefix(Package, "github.com/health-router/health-router/") {
		t.Errorf("LDFlags = %q", got)
	}
}
