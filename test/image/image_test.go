// Package image_test builds the container image with deploy/image (twice, to check that it is
// reproducible), loads it with go-containerregistry, checks what a platform team relies on
// (both platforms, the non-root user, the entrypoint, the OCI labels, no shell, a static binary
// of the right architecture, the CA bundle pinned by go.mod) and runs the linux/amd64 binary taken out of the
// image: `--help`, `version` and a replay of the demo scenario.
package image_test

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/health-router/health-router/test/harness"
)

// What the test builds the image with; the labels must say the same.
const (
	epoch    = 1763726400 // 2025-11-21T12:00:00Z
	version  = "v0.0.0-test"
	revision = "0123456789abcdef0123456789abcdef01234567"
	source   = "https://github.com/health-router/health-router"
)

var platforms = []string{"linux/amd64", "linux/arm64"}

// repoRoot is the repository's root, from this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// built is the image the tests share: built once per test run (the second build only checks
// the digest), as the Go build cache makes the second one cheap.
var built struct {
	once   sync.Once
	dir    string
	digest string
	err    error
}

// buildImage runs `go run ./deploy/image build` into out and returns the digest it printed.
func buildImage(t *testing.T, out string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", "run", "./deploy/image", "build", "--out", out,
		"--version", version, "--revision", revision, "--source", source, "--platforms", strings.Join(platforms, ","))
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(epoch, 10))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", errors.New("deploy/image build: " + err.Error() + "\n" + stderr.String())
	}
	t.Logf("built %s in %s", out, time.Since(start).Round(time.Millisecond))
	return strings.TrimSpace(stdout.String()), nil
}

// image returns the shared build's index.
func image(t *testing.T) (v1.ImageIndex, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image for two platforms")
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "health-router-image-test-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = filepath.Join(dir, "image")
		built.digest, built.err = buildImage(t, built.dir)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return load(t, built.dir), built.digest
}

// load reads the image index from an OCI layout: the layout's index.json names one index.
func load(t *testing.T, dir string) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := outer.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("%s/index.json: %+v, want one OCI image index", dir, m.Manifests)
	}
	idx, err := outer.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(filepath.Dir(built.dir))
	}
	os.Exit(code)
}

// images returns the index's images by platform (os/arch).
func images(t *testing.T, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.Image{}
	for _, d := range m.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %s: media type %s, want %s", d.Digest, d.MediaType, types.OCIManifestSchema1)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Platform.OS+"/"+d.Platform.Architecture] = img
	}
	return out
}

// files reads an image's filesystem: path -> header, and the bodies of the files asked for.
func files(t *testing.T, img v1.Image, want ...string) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	headers, bodies := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		headers[name] = h
		if slices.Contains(want, name) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			bodies[name] = b
		}
	}
	return headers, bodies
}

func TestImage(t *testing.T) {
	idx, digest := image(t)
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d.String() != digest {
		t.Errorf("deploy/image printed %s, the layout holds %s", digest, d)
	}
	byPlatform := images(t, idx)
	if got := slices.Sorted(mapKeys(byPlatform)); !slices.Equal(got, platforms) {
		t.Fatalf("platforms %q, want %q", got, platforms)
	}
	ca := pinnedBundle(t)
	wantMachine := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	for _, p := range platforms {
		img := byPlatform[p]
		t.Run(p, func(t *testing.T) {
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS+"/"+cfg.Architecture != p {
				t.Errorf("config says %s/%s", cfg.OS, cfg.Architecture)
			}
			if cfg.Config.User != "65532:65532" {
				t.Errorf("user %q, want 65532:65532 (non-root, as the chart's securityContext)", cfg.Config.User)
			}
			if !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/local/bin/health-router"}) || len(cfg.Config.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [/usr/local/bin/health-router] and no cmd (the chart passes args [run])", cfg.Config.Entrypoint, cfg.Config.Cmd)
			}
			for k, v := range map[string]string{
				"org.opencontainers.image.source":   source,
				"org.opencontainers.image.version":  version,
				"org.opencontainers.image.revision": revision,
			} {
				if cfg.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cfg.Config.Labels[k], v)
				}
			}
			if !cfg.Created.Time.Equal(time.Unix(epoch, 0)) {
				t.Errorf("created %s, want SOURCE_DATE_EPOCH %s", cfg.Created.Time, time.Unix(epoch, 0).UTC())
			}

			headers, bodies := files(t, img, "/usr/local/bin/health-router", "/etc/ssl/certs/ca-certificates.crt", "/etc/passwd")
			for name, h := range headers {
				base := filepath.Base(name)
				if base == "sh" || base == "bash" || base == "busybox" || base == "ash" {
					t.Errorf("the image has a shell: %s", name)
				}
				if !h.ModTime.Equal(time.Unix(epoch, 0)) {
					t.Errorf("%s: mtime %s, want SOURCE_DATE_EPOCH", name, h.ModTime)
				}
			}
			if _, ok := headers["/bin/sh"]; ok {
				t.Error("the image has /bin/sh")
			}
			if !bytes.Equal(bodies["/etc/ssl/certs/ca-certificates.crt"], ca) {
				t.Errorf("/etc/ssl/certs/ca-certificates.crt (%d bytes) is not the bundle pinned by go.mod (%d bytes)", len(bodies["/etc/ssl/certs/ca-certificates.crt"]), len(ca))
			}
			if !strings.Contains(string(bodies["/etc/passwd"]), ":65532:65532:") {
				t.Errorf("/etc/passwd has no user 65532: %q", bodies["/etc/passwd"])
			}
			bin := bodies["/usr/local/bin/health-router"]
			h := headers["/usr/local/bin/health-router"]
			if h == nil || h.Mode&0o111 == 0 {
				t.Fatalf("/usr/local/bin/health-router missing or not executable: %+v", h)
			}
			f, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatalf("/usr/local/bin/health-router: %v", err)
			}
			if f.Machine != wantMachine[p] {
				t.Errorf("binary for %s, want %s", f.Machine, wantMachine[p])
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Error("binary is dynamically linked (has PT_INTERP): want CGO_ENABLED=0, static")
				}
			}

			size, err := imageSize(img)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d bytes compressed (%.1f MiB), binary %d bytes", p, size, float64(size)/(1<<20), len(bin))
		})
	}
}

// imageSize is what a pull transfers: the manifest's layers and config, compressed.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestBinaryRuns runs the linux/amd64 binary taken out of the image (this machine is amd64):
// `--help`, `version` (the version and commit the image was built with), and a replay of the
// demo scenario, whose decisions must equal those of the binary built from source here.
func TestBinaryRuns(t *testing.T) {
	if runtime.GOARCH != "amd64" || runtime.GOOS != "linux" {
		t.Fatalf("runs the linux/amd64 binary: this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	idx, _ := image(t)
	_, bodies := files(t, images(t, idx)["linux/amd64"], "/usr/local/bin/health-router")
	bin := filepath.Join(t.TempDir(), "health-router")
	if err := os.WriteFile(bin, bodies["/usr/local/bin/health-router"], 0o755); err != nil {
		t.Fatal(err)
	}
	root := repoRoot(t)
	// No HEALTH_ROUTER_* from this machine's environment.
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "HEALTH_ROUTER_") {
			env = append(env, e)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	help := run(bin, "--help")
	for _, want := range []string{"Usage:\n  health-router <command> [flags]", "run", "doctor", "replay", "version"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not mention %q:\n%s", want, help)
		}
	}
	// The image's binary says the version and commit it was built for (the labels' own).
	if v := run(bin, "version", "-o", "json"); !strings.Contains(v, `"version": "`+version+`"`) || !strings.Contains(v, `"commit": "`+revision+`"`) {
		t.Errorf("version of the image's binary, want %s and %s:\n%s", version, revision, v)
	}
	replayArgs := []string{"replay", "--cluster", "test/demo/cluster.yaml", "--events", "test/demo/events", "--aws", "test/demo/aws.yaml", "--now", "2026-11-21T12:00:00Z", "-o", "json"}
	fromImage := run(bin, replayArgs...)
	if !strings.Contains(fromImage, `"action"`) {
		t.Fatalf("replay printed no decisions:\n%s", fromImage)
	}
	events, err := os.ReadDir(filepath.Join(root, "test", "demo", "events"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(strings.TrimSpace(fromImage), "\n") + 1; lines < len(events) {
		t.Errorf("replay printed %d decisions for %d events", lines, len(events))
	}
	fromSource := run("go", append([]string{"run", "./cmd/health-router"}, replayArgs...)...)
	if fromImage != fromSource {
		t.Errorf("the image's binary and the source disagree on the demo:\nimage:\n%s\nsource:\n%s", fromImage, fromSource)
	}
}

// TestReproducible builds the image a second time from the same tree and epoch: the digest
// must not change.
func TestReproducible(t *testing.T) {
	_, first := image(t)
	second, err := buildImage(t, filepath.Join(t.TempDir(), "image"))
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("same tree, same SOURCE_DATE_EPOCH: digests %s and %s", first, second)
	}
	t.Logf("two builds, one digest: %s", first)
}
