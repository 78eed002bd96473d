package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func TestParsePlatforms(t *testing.T) {
	host := platform{runtime.GOOS, runtime.GOARCH}
	for _, tt := range []struct {
		in      string
		want    []platform
		wantErr string
	}{
		{in: "linux/amd64,darwin/arm64", want: []platform{{"linux", "amd64"}, {"darwin", "arm64"}}},
		{in: " linux/arm64 ", want: []platform{{"linux", "arm64"}}},
		{in: "host", want: []platform{host}},
		{in: "linux/amd64,linux/amd64", wantErr: "twice"},
		{in: "linux", wantErr: "not os/arch"},
		{in: "linux/", wantErr: "not os/arch"},
		{in: "linux/arm/v7", wantErr: "not os/arch"},
		{in: "", wantErr: "not os/arch"},
	} {
		got, err := parsePlatforms(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parsePlatforms(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("parsePlatforms(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestReleaseVersion(t *testing.T) {
	for _, tt := range []struct {
		in, want string
	}{
		{"v0.1.0", "0.1.0"},
		{"1.2.3", "1.2.3"},
		{"v1.2.3-rc.1", "1.2.3-rc.1"},
		{"v0.1.0-3-gabc1234-dirty", "0.1.0-3-gabc1234-dirty"}, // git describe after a tag
		{"v0.0.0-dev.g37dfacb", "0.0.0-dev.g37dfacb"},         // the Makefile's before any tag
		{"37dfacb", ""},                                       // git describe --always without a tag
		{"v1.2", ""},
		{"", ""},
		{"v01.2.3", ""},
	} {
		got, err := releaseVersion(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("releaseVersion(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("releaseVersion(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Setenv("HELM_BIN", "")
	t.Setenv("COSIGN_PASSWORD", "")
	const chart = "../charts/health-router"
	base := []string{"--version", "v1.0.0", "--revision", "abc", "--helm", "/bin/helm", "--chart", chart}
	key := writeKey(t, pkcs8PEM(t, newKey(t)))
	for _, tt := range []struct {
		name    string
		epoch   string
		args    []string
		signed  bool
		wantErr string
	}{
		{name: "all set", epoch: "1763726400", args: base},
		{name: "no epoch", epoch: "", args: base, wantErr: "SOURCE_DATE_EPOCH"},
		{name: "no revision", epoch: "1", args: []string{"--version", "v1.0.0", "--helm", "h"}, wantErr: "--revision"},
		{name: "no helm", epoch: "1", args: []string{"--version", "v1.0.0", "--revision", "abc"}, wantErr: "--helm"},
		{name: "darwin image", epoch: "1", args: append(slices.Clone(base), "--image-platforms", "darwin/arm64"), wantErr: "not linux"},
		{name: "bad version", epoch: "1", args: []string{"--version", "main", "--revision", "abc", "--helm", "h"}, wantErr: "semantic version"},
		{name: "signed", epoch: "1763726400", args: append(slices.Clone(base), "--signing-key", key), signed: true},
		{name: "no key file", epoch: "1", args: append(slices.Clone(base), "--signing-key", key+".missing"), wantErr: "--signing-key"},
		{name: "not a key", epoch: "1", args: append(slices.Clone(base), "--signing-key", "main.go"), wantErr: "--signing-key main.go: no PEM block"},
		{name: "no chart", epoch: "1", args: append(slices.Clone(base), "--chart", "nowhere"), wantErr: "--chart"},
	} {
		t.Setenv("SOURCE_DATE_EPOCH", tt.epoch)
		o, err := parse(tt.args)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if o.version != "1.0.0" || !o.epoch.Equal(time.Unix(1763726400, 0)) || len(o.platforms) != 4 || len(o.imagePlatforms) != 2 {
			t.Errorf("%s: %+v", tt.name, o)
		}
		if o.imageRepository != "ghcr.io/health-router/health-router" || o.builderID != defaultBuilderID {
			t.Errorf("%s: image repository %q (want the chart's), builder %q", tt.name, o.imageRepository, o.builderID)
		}
		if (o.key != nil) != tt.signed {
			t.Errorf("%s: signing key %v, want signed %t", tt.name, o.key != nil, tt.signed)
		}
	}
}

func TestNames(t *testing.T) {
	if got := cliFile("1.2.3", platform{"darwin", "arm64"}); got != "health-router_1.2.3_darwin_arm64.tar.gz" {
		t.Errorf("cliFile = %q", got)
	}
	if got := chartFile("1.2.3"); got != "health-router-1.2.3.tgz" { // helm package's own name
		t.Errorf("chartFile = %q", got)
	}
}

// entry is a tar entry as read back.
type entry struct {
	name  string
	mode  int64
	mtime time.Time
	uid   int
	uname string
	body  string
}

func readTgz(t *testing.T, b []byte) (gzip.Header, []entry) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return zr.Header, out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{h.Name, h.Mode, h.ModTime, h.Uid, h.Uname, string(body)})
	}
}

// helmLike writes a tgz as helm package does: the time of packaging on every entry, the
// builder's user, helm's gzip marks.
func helmLike(t *testing.T, now time.Time, user string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Extra, zw.Comment, zw.ModTime, zw.Name = []byte("+aHR0cHM6Ly95b3V0dS5iZS96OVV6MWljandyTQo=Helm"), "Helm", now, "chart.tgz"
	tw := tar.NewWriter(zw)
	for _, f := range []archiveFile{{"c/Chart.yaml", 0o644, []byte("name: c\n")}, {"c/values.yaml", 0o644, []byte("a: 1\n")}, {"c/templates/x.yaml", 0o600, []byte("kind: X\n")}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.body)), ModTime: now, Uname: user, Uid: 1000}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRetime(t *testing.T) {
	epoch := time.Unix(1763726400, 0).UTC()
	a := helmLike(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "alice")
	b := helmLike(t, time.Date(2027, 6, 7, 8, 9, 10, 0, time.UTC), "bob")
	if bytes.Equal(a, b) {
		t.Fatal("the two packagings are equal already: the test proves nothing")
	}
	ra, err := retime(a, epoch, nil)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := retime(b, epoch, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ra, rb) {
		t.Error("one chart packaged at two times by two users: two archives after retime")
	}
	h, entries := readTgz(t, ra)
	if h.Comment != "Helm" || !strings.HasSuffix(string(h.Extra), "Helm") || !h.ModTime.IsZero() || h.Name != "" {
		t.Errorf("gzip header %+v: want helm's marks, no name, no time", h)
	}
	want := []entry{
		{"c/Chart.yaml", 0o644, epoch, 0, "", "name: c\n"},
		{"c/values.yaml", 0o644, epoch, 0, "", "a: 1\n"},
		{"c/templates/x.yaml", 0o600, epoch, 0, "", "kind: X\n"},
	}
	if len(entries) != len(want) {
		t.Fatalf("entries %+v, want %+v", entries, want)
	}
	for i := range want {
		if got := entries[i]; got.name != want[i].name || got.mode != want[i].mode || !got.mtime.Equal(epoch) || got.uid != 0 || got.uname != "" || got.body != want[i].body {
			t.Errorf("entry %d: %+v, want %+v", i, got, want[i])
		}
	}
}

func TestRetimeRefusesLinks(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "c/link", Linkname: "/etc/passwd"}); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	zw.Close()
	if _, err := retime(buf.Bytes(), time.Unix(0, 0), nil); err == nil {
		t.Error("retime kept a symlink: want only regular files")
	}
}

func TestTarGz(t *testing.T) {
	epoch := time.Unix(1763726400, 0).UTC()
	files := []archiveFile{{"health-router", 0o755, []byte("\x7fELF...")}, {"LICENSE", 0o644, []byte("Apache")}, {"README.md", 0o644, []byte("# hr")}}
	first, err := tarGz(epoch, nil, files)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // a second later: nothing of the clock may get in
	second, err := tarGz(epoch, nil, files)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Error("two archives of the same files differ")
	}
	_, entries := readTgz(t, first)
	var names []string
	for i, e := range entries {
		names = append(names, e.name)
		if e.mode != files[i].mode || !e.mtime.Equal(epoch) || e.body != string(files[i].body) {
			t.Errorf("%s: %+v", e.name, e)
		}
	}
	if !slices.Equal(names, []string{"health-router", "LICENSE", "README.md"}) {
		t.Errorf("entries %q, want the order given", names)
	}
}

func TestChecksums(t *testing.T) {
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	fsys := fstest.MapFS{
		"b.tar.gz":                 {Data: []byte("bbb")},
		"a.tgz":                    {Data: []byte("aaa")},
		"image/blobs/sha256/0abc":  {Data: []byte("blob")},
		"image/index.json":         {Data: []byte("{}")},
		"SHA256SUMS":               {Data: []byte("stale")},
		"health-router_sbom.json":  {Data: []byte("")},
		"image/blobs/sha256/empty": {Data: nil},
	}
	got, err := checksums(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s  a.tgz\n%s  b.tar.gz\n%s  health-router_sbom.json\n%s  image/blobs/sha256/0abc\n%s  image/blobs/sha256/empty\n%s  image/index.json\n",
		sum("aaa"), sum("bbb"), sum(""), sum("blob"), sum(""), sum("{}"))
	if string(got) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant (sorted, SHA256SUMS itself left out):\n%s", got, want)
	}
}

// TestMakeVersions: make build, make image and make release stamp one version, as a release
// names it (the release binary said 0.0.0-dev.g<commit> where make build said the commit,
// issue 38, 15), and the chart README's install example asks for the tag a release pushes
// (the chart's appVersion, no "v").
func TestMakeVersions(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "--no-print-directory", "-n", "-C", "../..", "build", "image", "release").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n: %v\n%s", err, out)
	}
	stamped := regexp.MustCompile(`version\.version=(\S+)`).FindAllStringSubmatch(string(out), -1)
	given := regexp.MustCompile(`--version (\S+)`).FindAllStringSubmatch(string(out), -1)
	if len(stamped) != 1 || len(given) != 2 {
		t.Fatalf("make -n build image release: %d -X stamps, %d --version; want 1 and 2:\n%s", len(stamped), len(given), out)
	}
	for _, g := range given {
		if g[1] != stamped[0][1] {
			t.Errorf("make build stamps %s, a --version is %s", stamped[0][1], g[1])
		}
	}
	if v, err := releaseVersion(stamped[0][1]); err != nil || v != stamped[0][1] {
		t.Errorf("make's version %s is not as a release names it (%s, %v)", stamped[0][1], v, err)
	}

	chart, err := os.ReadFile("../../deploy/charts/health-router/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../deploy/charts/health-router/README.md")
	if err != nil {
		t.Fatal(err)
	}
	app := regexp.MustCompile(`(?m)^appVersion: "?([^"\s]+)"?`).FindSubmatch(chart)
	tags := regexp.MustCompile(`image\.tag=(\S+)`).FindAllSubmatch(readme, -1)
	if app == nil || len(tags) == 0 {
		t.Fatalf("no appVersion in Chart.yaml, or no image.tag= in the README")
	}
	for _, tag := range tags {
		if string(tag[1]) != string(app[1]) {
			t.Errorf("the chart README sets image.tag=%s; a release tags the image %s", tag[1], app[1])
		}
	}
}
