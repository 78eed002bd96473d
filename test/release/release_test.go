// Package release_test runs `make release`'s tool (deploy/release) for this machine's platform
// only, as make test can afford (the image for linux/<this arch>, one CLI archive; the four
// platforms of a real release would cross-compile three more binaries), signed with a
// throwaway key, and checks what a user checks: SHA256SUMS verifies and covers every file; the
// OCI layout holds the image index and an SBOM and a provenance that refer to it; the SBOM
// names the binary's Go modules at the versions the build selected (sigs.k8s.io/karpenter,
// aws-sdk-go-v2, and every one `go version -m` lists) and the image's CA bundle; the
// signatures (SHA256SUMS.sig, the index's, the provenance's DSSE envelope) verify with the
// public key as cosign checks them, here with nothing but the standard library; `release
// verify` passes with that key and fails with another; the chart archive is one helm reads,
// lints and renders with the release's image by digest; the CLI archive holds the image's own
// binary, LICENSE and README.md; and `deploy/image push` takes the SBOM, the provenance and
// cosign's signature and attestation along to a registry, with and without the referrers API.
package release_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
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

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"

	"github.com/health-router/health-router/test/harness"
)

// What the test releases.
const (
	epoch    = 1763726400 // 2025-11-21T12:00:00Z
	tag      = "v1.2.3-test.1"
	version  = "1.2.3-test.1" // the files' version: the tag without its v
	revision = "0123456789abcdef0123456789abcdef01234567"
	spdxType = "application/spdx+json"
	intoto   = "application/vnd.in-toto+json"
	// repository is the chart's default image.repository: what the signature names.
	repository = "ghcr.io/health-router/health-router"
)

// host is the one platform released: the CLI for this machine, the image for linux on its
// architecture (on linux the CLI archive then holds the image's binary).
var host = runtime.GOOS + "/" + runtime.GOARCH

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helmBin is HELM_BIN (set by make test) or the binary test/tools/helm-bin.sh builds and
// caches. No helm fails the test: it is never skipped.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HELM_BIN"); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join(repoRoot(t), "test", "tools", "helm-bin.sh")).Output()
	if err != nil {
		t.Fatalf("HELM_BIN is not set and test/tools/helm-bin.sh failed: %v", err)
	}
	return strings.TrimSpace(string(out))
}

var released struct {
	once   sync.Once
	dir    string
	key    *ecdsa.PrivateKey // the throwaway key the release is signed with
	stderr string
	err    error
}

// release runs deploy/release once for the tests of this package and returns its directory.
func release(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a release")
	}
	released.once.Do(func() {
		dir, err := os.MkdirTemp("", "health-router-release-test-")
		if err != nil {
			released.err = err
			return
		}
		released.dir = filepath.Join(dir, "release")
		keyFile := filepath.Join(dir, "signing.pem")
		if released.key, released.err = writeKey(keyFile); released.err != nil {
			return
		}
		cmd := exec.Command("go", "run", "./deploy/release", "--out", released.dir, "--version", tag, "--revision", revision,
			"--helm", helmBin(t), "--platforms", host, "--image-platforms", "linux/"+runtime.GOARCH, "--signing-key", keyFile)
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.Itoa(epoch))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			released.err = fmt.Errorf("deploy/release: %w\n%s", err, stderr.String())
			return
		}
		released.stderr = stderr.String()
		t.Logf("released %s in %s:\n%s", host, time.Since(start).Round(time.Millisecond), stdout.String())
	})
	if released.err != nil {
		t.Fatal(released.err)
	}
	return released.dir
}

// writeKey writes a new ECDSA P-256 key, PKCS #8 PEM, to path.
func writeKey(path string) (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return key, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if released.dir != "" {
		os.RemoveAll(filepath.Dir(released.dir))
	}
	os.Exit(code)
}

func TestFiles(t *testing.T) {
	dir := release(t)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	goos, goarch, _ := strings.Cut(host, "/")
	want := []string{"SHA256SUMS", "SHA256SUMS.sig", "cosign.pub", "health-router-" + version + ".tgz", "health-router_" + version + "_" + goos + "_" + goarch + ".tar.gz",
		"health-router_" + version + "_provenance.dsse.json", "health-router_" + version + "_provenance.intoto.json", "health-router_" + version + "_sbom.spdx.json", "image"}
	if !slices.Equal(names, want) {
		t.Errorf("files %q, want %q", names, want)
	}
}

// TestChecksums reads SHA256SUMS as sha256sum -c does: every line's file has that hash, and
// every file but SHA256SUMS and the two written after it (its signature, the public key) has a
// line.
func TestChecksums(t *testing.T) {
	dir := release(t)
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, path, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Errorf("SHA256SUMS line %q is not `<sha256>  <path>`", sc.Text())
			continue
		}
		body, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(path)))
		if err != nil {
			t.Errorf("SHA256SUMS lists %s: %v", path, err)
			continue
		}
		if got := sha256.Sum256(body); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", path, got, sum)
		}
		listed[path] = true
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel != "SHA256SUMS" && rel != "SHA256SUMS.sig" && rel != "cosign.pub" && !listed[filepath.ToSlash(rel)] {
			t.Errorf("%s is not in SHA256SUMS", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) < 5 {
		t.Errorf("SHA256SUMS lists %d files", len(listed))
	}
	// The command docs/releasing.md gives, where coreutils is installed.
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum --check: %v\n%s", err, out)
		}
	}
}

// layoutParts is the release's OCI layout: the image index, the SBOM and provenance artifacts,
// and cosign's signature and attestation.
type layoutParts struct {
	index          v1.ImageIndex
	indexDesc      v1.Descriptor
	sbomDesc       v1.Descriptor
	sbom           v1.Image
	provenanceDesc v1.Descriptor
	sigDesc        v1.Descriptor
	attDesc        v1.Descriptor
	outer          v1.ImageIndex
}

func openLayout(t *testing.T, dir string) layoutParts {
	t.Helper()
	p, err := layout.FromPath(filepath.Join(dir, "image"))
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
	if len(m.Manifests) != 5 {
		t.Fatalf("index.json lists %d manifests, want the image index, the SBOM, the provenance, the signature and the attestation: %+v", len(m.Manifests), m.Manifests)
	}
	lp := layoutParts{outer: outer}
	// The index first: the signatures' tags name its digest.
	for _, d := range m.Manifests {
		if d.MediaType == types.OCIImageIndex && d.Annotations["org.opencontainers.image.ref.name"] == version {
			lp.indexDesc = d
			if lp.index, err = outer.ImageIndex(d.Digest); err != nil {
				t.Fatal(err)
			}
		}
	}
	if lp.index == nil {
		t.Fatalf("index.json %+v: no image index named %s", m.Manifests, version)
	}
	cosignTag := "sha256-" + lp.indexDesc.Digest.Hex
	for _, d := range m.Manifests {
		switch {
		case d.Digest == lp.indexDesc.Digest:
		case d.MediaType == types.OCIManifestSchema1 && d.ArtifactType == spdxType:
			lp.sbomDesc = d
			if lp.sbom, err = outer.Image(d.Digest); err != nil {
				t.Fatal(err)
			}
		case d.MediaType == types.OCIManifestSchema1 && d.ArtifactType == intoto:
			lp.provenanceDesc = d
		case d.Annotations["org.opencontainers.image.ref.name"] == cosignTag+".sig":
			lp.sigDesc = d
		case d.Annotations["org.opencontainers.image.ref.name"] == cosignTag+".att":
			lp.attDesc = d
		default:
			t.Fatalf("index.json: unexpected %+v", d)
		}
	}
	if lp.sbom == nil || lp.provenanceDesc.Digest.Hex == "" || lp.sigDesc.Digest.Hex == "" || lp.attDesc.Digest.Hex == "" {
		t.Fatalf("index.json %+v: want an SBOM, a provenance, %s.sig and %s.att", m.Manifests, cosignTag, cosignTag)
	}
	return lp
}

// layer returns the content of a manifest's only layer and its descriptor.
func layer(t *testing.T, lp layoutParts, d v1.Descriptor) ([]byte, v1.Descriptor) {
	t.Helper()
	img, err := lp.outer.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("%s has %d layers, want one", d.Digest, len(m.Layers))
	}
	l, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, m.Layers[0]
}

// imageFile is a file of the released image, from its one layer.
func imageFile(t *testing.T, lp layoutParts, path string) []byte {
	t.Helper()
	im, err := lp.index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := lp.index.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the image", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestLayout checks the image index (one image, linux on this architecture, labelled with the
// release) and that the SBOM refers to it.
func TestLayout(t *testing.T) {
	dir := release(t)
	lp := openLayout(t, dir)
	im, err := lp.index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.String() != "linux/"+runtime.GOARCH {
		t.Fatalf("image index %+v, want linux/%s only", im.Manifests, runtime.GOARCH)
	}
	if im.Annotations["org.opencontainers.image.version"] != version || im.Annotations["org.opencontainers.image.revision"] != revision {
		t.Errorf("index annotations %v", im.Annotations)
	}
	img, err := lp.index.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH || cfg.Created.Unix() != epoch {
		t.Errorf("config %s/%s created %s", cfg.OS, cfg.Architecture, cfg.Created)
	}

	sm, err := lp.sbom.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if sm.Subject == nil || sm.Subject.Digest != lp.indexDesc.Digest || sm.Subject.Size != lp.indexDesc.Size || sm.Subject.MediaType != types.OCIImageIndex {
		t.Errorf("the SBOM's subject %+v, want the image index %s", sm.Subject, lp.indexDesc.Digest)
	}
	if sm.ArtifactType != spdxType || len(sm.Layers) != 1 || sm.Layers[0].MediaType != spdxType {
		t.Errorf("the SBOM manifest %+v: want artifactType and one layer of %s", sm, spdxType)
	}
	// The layer is the document published beside it.
	file, err := os.ReadFile(filepath.Join(dir, "health-router_"+version+"_sbom.spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256.Sum256(file); "sha256:"+hex.EncodeToString(got[:]) != sm.Layers[0].Digest.String() {
		t.Errorf("the SBOM file's digest sha256:%x, the layer's %s", got, sm.Layers[0].Digest)
	}
}

// spdx is what the test reads of the SBOM.
type spdx struct {
	SPDXVersion string `json:"spdxVersion"`
	Packages    []struct {
		Name        string `json:"name"`
		VersionInfo string `json:"versionInfo"`
		Checksums   []struct {
			Algorithm     string `json:"algorithm"`
			ChecksumValue string `json:"checksumValue"`
		} `json:"checksums"`
		ExternalRefs []struct {
			ReferenceType    string `json:"referenceType"`
			ReferenceLocator string `json:"referenceLocator"`
		} `json:"externalRefs"`
	} `json:"packages"`
}

// TestSBOM checks the SBOM against two other readings of the same build: `go list -m` (the
// versions go.mod selects) for the modules a reader looks for first, and `go version -m` of
// the released binary for the whole list.
func TestSBOM(t *testing.T) {
	dir := release(t)
	lp := openLayout(t, dir)
	layers, err := lp.sbom.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("SBOM layers %v, %v", layers, err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var doc spdx
	if err := json.NewDecoder(rc).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" {
		t.Errorf("spdxVersion %q", doc.SPDXVersion)
	}
	inSBOM := map[string]string{}
	for _, p := range doc.Packages {
		inSBOM[p.Name] = p.VersionInfo
	}

	// The build list's versions, from the go command.
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "sigs.k8s.io/karpenter", "github.com/aws/aws-sdk-go-v2", "github.com/aws/aws-sdk-go-v2/service/ec2", "github.com/aws/karpenter-provider-aws")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, v, _ := strings.Cut(line, " ")
		if inSBOM[path] != v {
			t.Errorf("SBOM: %s at %q, go.mod selects %s", path, inSBOM[path], v)
		}
	}

	// Every module `go version -m` lists for the released binary, and no other.
	bin := filepath.Join(t.TempDir(), "health-router")
	if err := os.WriteFile(bin, archiveEntries(t, filepath.Join(dir, cliName()))["health-router"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	fromGo := map[string]string{}
	last := ""
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "dep":
			fromGo[f[1]], last = f[2], f[1]
		case len(f) >= 3 && f[0] == "=>" && last != "": // the dep above is replaced: this version went in
			fromGo[last] = f[2]
		}
	}
	if len(fromGo) < 50 {
		t.Fatalf("go version -m lists %d modules:\n%s", len(fromGo), out)
	}
	for path, v := range fromGo {
		if inSBOM[path] != v {
			t.Errorf("go version -m: %s %s; the SBOM: %q", path, v, inSBOM[path])
		}
	}
	if extra := len(doc.Packages) - 3 - len(fromGo); extra != 0 { // health-router, stdlib and the CA bundle besides
		t.Errorf("the SBOM lists %d packages more than go version -m's modules", extra)
	}

	// The image's CA bundle, by the SHA-256 of the file in the image, at the version of its
	// module go.mod selects.
	cmd = exec.Command("go", "list", "-m", "-f", "{{.Version}}", "golang.org/x/crypto/x509roots/fallback")
	cmd.Dir = repoRoot(t)
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	caVersion := strings.TrimSpace(string(out))
	sum := sha256.Sum256(imageFile(t, lp, "etc/ssl/certs/ca-certificates.crt"))
	found := false
	for _, p := range doc.Packages {
		for _, c := range p.Checksums {
			found = found || (c.Algorithm == "SHA256" && c.ChecksumValue == hex.EncodeToString(sum[:]) && p.VersionInfo == caVersion)
		}
	}
	if !found {
		t.Errorf("the SBOM lists no package with the SHA-256 %x of the image's CA bundle at %s, the version go.mod selects", sum, caVersion)
	}
}

func cliName() string {
	goos, goarch, _ := strings.Cut(host, "/")
	return "health-router_" + version + "_" + goos + "_" + goarch + ".tar.gz"
}

// archiveEntries reads a .tar.gz: each entry's body by name, failing on anything but regular
// files with the epoch as their time.
func archiveEntries(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	var order []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || h.ModTime.Unix() != epoch || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s type %q mtime %s owner %d:%d, want a regular file at SOURCE_DATE_EPOCH owned by root", path, h.Name, h.Typeflag, h.ModTime, h.Uid, h.Gid)
		}
		if out[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
		order = append(order, h.Name)
	}
	t.Logf("%s: %q", filepath.Base(path), order)
	return out
}

// TestCLIArchive checks the archive's three files; on linux, that its binary is the image's
// (not a second build that could differ) and that it runs.
func TestCLIArchive(t *testing.T) {
	dir := release(t)
	files := archiveEntries(t, filepath.Join(dir, cliName()))
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"LICENSE", "README.md", "health-router"}) {
		t.Fatalf("archive holds %q", names)
	}
	for _, f := range []string{"LICENSE", "README.md"} {
		want, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files[f], want) {
			t.Errorf("the archive's %s is not the repository's", f)
		}
	}
	if !strings.HasPrefix(string(files["LICENSE"]), "\n                                 Apache License\n                           Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
	if runtime.GOOS != "linux" {
		t.Logf("on %s the CLI is built for the archive; the image's binary is linux's", runtime.GOOS)
		return
	}
	inImage := imageFile(t, openLayout(t, dir), "usr/local/bin/health-router")
	if inImage == nil || !bytes.Equal(inImage, files["health-router"]) {
		t.Errorf("the archive's binary (%d bytes) is not the image's (%d bytes)", len(files["health-router"]), len(inImage))
	}
	bin := filepath.Join(t.TempDir(), "health-router")
	if err := os.WriteFile(bin, files["health-router"], 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "replay") {
		t.Errorf("health-router --help: %v\n%s", err, out)
	}
}

// helm runs the helm binary with its state in a temporary directory.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// TestChart reads the packaged chart as a user's helm does: its metadata, a strict lint,
// and the image a default install runs, which is the release's, by digest.
func TestChart(t *testing.T) {
	dir := release(t)
	tgz := filepath.Join(dir, "health-router-"+version+".tgz")
	files := archiveEntries(t, tgz)
	for _, f := range []string{"health-router/Chart.yaml", "health-router/values.yaml", "health-router/values.schema.json", "health-router/templates/deployment.yaml"} {
		if files[f] == nil {
			t.Errorf("the chart archive has no %s", f)
		}
	}
	out, err := helm(t, "show", "chart", tgz)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Name, Version, AppVersion string
	}
	if err := yaml.Unmarshal([]byte(out), &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Name != "health-router" || meta.Version != version || meta.AppVersion != version {
		t.Errorf("helm show chart: %+v, want health-router version and appVersion %s", meta, version)
	}
	values := filepath.Join(repoRoot(t), "deploy", "charts", "health-router", "ci", "default-values.yaml")
	if out, err := helm(t, "lint", "--strict", tgz, "-f", values); err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
		t.Errorf("helm lint --strict: %v\n%s", err, out)
	}
	out, err = helm(t, "template", "hr", tgz, "-f", values, "--show-only", "templates/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := "image: " + repository + ":" + version + "@" + openLayout(t, dir).indexDesc.Digest.String() + "\n"; !strings.Contains(out, want) {
		t.Errorf("the packaged chart's Deployment does not run the release's image by digest (%q):\n%s", strings.TrimSpace(want), out)
	}
}

// TestPush pushes the release's layout with deploy/image to a registry (go-containerregistry's,
// speaking the distribution API) and finds the SBOM as a registry client does, through the
// index's referrers: with the OCI referrers API, and without it (the sha256-<digest> tag).
func TestPush(t *testing.T) {
	dir := release(t)
	lp := openLayout(t, dir)
	for _, referrersAPI := range []bool{true, false} {
		t.Run(fmt.Sprintf("referrers API %t", referrersAPI), func(t *testing.T) {
			srv := httptest.NewServer(registry.New(registry.WithReferrersSupport(referrersAPI), registry.Logger(log.New(io.Discard, "", 0))))
			defer srv.Close()
			ref := strings.TrimPrefix(srv.URL, "http://") + "/health-router:" + version
			cmd := exec.Command("go", "run", "./deploy/image", "push", "--layout", filepath.Join(dir, "image"), "--ref", ref)
			cmd.Dir = repoRoot(t)
			cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir()) // anonymous
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("deploy/image push: %v\n%s", err, out)
			}
			r, err := name.ParseReference(ref)
			if err != nil {
				t.Fatal(err)
			}
			desc, err := remote.Head(r)
			if err != nil {
				t.Fatal(err)
			}
			if desc.Digest != lp.indexDesc.Digest {
				t.Errorf("%s is %s, want the image index %s", ref, desc.Digest, lp.indexDesc.Digest)
			}
			// No filter on artifactType: go-containerregistry's registry reports the config's
			// media type in its place (the OCI 1.0 way); the manifest says which it is.
			refs, err := remote.Referrers(r.Context().Digest(desc.Digest.String()))
			if err != nil {
				t.Fatal(err)
			}
			rm, err := refs.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			got := map[v1.Hash]bool{}
			for _, d := range rm.Manifests {
				got[d.Digest] = true
			}
			if len(rm.Manifests) != 2 || !got[lp.sbomDesc.Digest] || !got[lp.provenanceDesc.Digest] {
				t.Fatalf("referrers of %s: %+v, want the SBOM %s and the provenance %s", desc.Digest, rm.Manifests, lp.sbomDesc.Digest, lp.provenanceDesc.Digest)
			}
			for _, want := range []struct {
				digest       v1.Hash
				artifactType string
			}{{lp.sbomDesc.Digest, spdxType}, {lp.provenanceDesc.Digest, intoto}} {
				img, err := remote.Image(r.Context().Digest(want.digest.String()))
				if err != nil {
					t.Fatal(err)
				}
				m, err := img.Manifest()
				if err != nil {
					t.Fatal(err)
				}
				if m.ArtifactType != want.artifactType || m.Subject == nil || m.Subject.Digest != desc.Digest {
					t.Errorf("the pushed referrer %s: artifactType %q subject %+v, want %s of %s", want.digest, m.ArtifactType, m.Subject, want.artifactType, desc.Digest)
				}
			}
			// cosign's signature and attestation, where cosign looks them up: the tags
			// sha256-<digest>.sig and .att of the index.
			for suffix, want := range map[string]v1.Hash{".sig": lp.sigDesc.Digest, ".att": lp.attDesc.Digest} {
				d, err := remote.Head(r.Context().Tag("sha256-" + desc.Digest.Hex + suffix))
				if err != nil || d.Digest != want {
					t.Errorf("the tag sha256-<index>%s: %v, %v; want %s", suffix, d, err, want)
				}
			}
		})
	}
}

// TestSignatures checks the signatures as cosign checks them with a key, with the standard
// library alone (not deploy/release's code): cosign.pub is the signing key's; SHA256SUMS.sig
// is the base64 ECDSA signature of SHA256SUMS's SHA-256 (cosign verify-blob); the index's
// signature is of cosign's simple-signing payload naming its digest (cosign verify); the
// attestation is a DSSE envelope of the provenance statement, signed over DSSE's PAE (cosign
// verify-attestation), whose subjects are the index and the release's files.
func TestSignatures(t *testing.T) {
	dir := release(t)
	lp := openLayout(t, dir)
	pubPEM, err := os.ReadFile(filepath.Join(dir, "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pubPEM)
	if block == nil || block.Type != "PUBLIC KEY" {
		t.Fatalf("cosign.pub %q is not a PEM PUBLIC KEY", pubPEM)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := k.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&released.key.PublicKey) {
		t.Fatal("cosign.pub is not the signing key's public key")
	}
	verifies := func(msg []byte, b64 string) bool {
		sig, err := base64.StdEncoding.DecodeString(b64)
		h := sha256.Sum256(msg)
		return err == nil && ecdsa.VerifyASN1(pub, h[:], sig)
	}

	sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	sumsSig, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS.sig"))
	if !verifies(sums, string(sumsSig)) {
		t.Error("SHA256SUMS.sig does not verify as cosign verify-blob --key cosign.pub checks it")
	}

	payload, desc := layer(t, lp, lp.sigDesc)
	var simple struct {
		Critical struct {
			Identity struct {
				DockerReference string `json:"docker-reference"`
			} `json:"identity"`
			Image struct {
				DockerManifestDigest string `json:"docker-manifest-digest"`
			} `json:"image"`
			Type string `json:"type"`
		} `json:"critical"`
	}
	if err := json.Unmarshal(payload, &simple); err != nil {
		t.Fatal(err)
	}
	c := simple.Critical
	if desc.MediaType != "application/vnd.dev.cosign.simplesigning.v1+json" || c.Type != "cosign container image signature" ||
		c.Image.DockerManifestDigest != lp.indexDesc.Digest.String() || c.Identity.DockerReference != repository {
		t.Errorf("the signature's payload %s (%s): want cosign's simple signing of %s@%s", payload, desc.MediaType, repository, lp.indexDesc.Digest)
	}
	if !verifies(payload, desc.Annotations["dev.cosignproject.cosign/signature"]) {
		t.Error("the image index's signature does not verify with cosign.pub")
	}

	envelope, desc := layer(t, lp, lp.attDesc)
	file, _ := os.ReadFile(filepath.Join(dir, "health-router_"+version+"_provenance.dsse.json"))
	if !bytes.Equal(envelope, file) || desc.MediaType != "application/vnd.dsse.envelope.v1+json" || desc.Annotations["predicateType"] != "https://slsa.dev/provenance/v1" {
		t.Errorf("the attestation %s: want the DSSE envelope beside it, of SLSA provenance v1", desc.Annotations)
	}
	var env struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
		Signatures  []struct {
			Sig string `json:"sig"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(envelope, &env); err != nil {
		t.Fatal(err)
	}
	statement, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	pae := fmt.Sprintf("DSSEv1 %d %s %d %s", len(env.PayloadType), env.PayloadType, len(statement), statement)
	if env.PayloadType != intoto || len(env.Signatures) != 1 || !verifies([]byte(pae), env.Signatures[0].Sig) {
		t.Errorf("the provenance envelope (%s, %d signatures) does not verify with cosign.pub", env.PayloadType, len(env.Signatures))
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, "health-router_"+version+"_provenance.intoto.json"))
	provenanceLayer, _ := layer(t, lp, lp.provenanceDesc)
	if !bytes.Equal(statement, onDisk) || !bytes.Equal(provenanceLayer, onDisk) {
		t.Error("the envelope, the provenance file and the provenance artifact do not hold one statement")
	}
	var st struct {
		Type    string `json:"_type"`
		Subject []struct {
			Name   string            `json:"name"`
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
		PredicateType string `json:"predicateType"`
	}
	if err := json.Unmarshal(statement, &st); err != nil {
		t.Fatal(err)
	}
	subjects := map[string]string{}
	for _, s := range st.Subject {
		subjects[s.Name] = s.Digest["sha256"]
	}
	want := map[string]string{repository: lp.indexDesc.Digest.Hex}
	for _, f := range []string{"health-router-" + version + ".tgz", cliName(), "health-router_" + version + "_sbom.spdx.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		want[f] = hex.EncodeToString(sum[:])
	}
	if st.Type != "https://in-toto.io/Statement/v1" || st.PredicateType != "https://slsa.dev/provenance/v1" || fmt.Sprint(subjects) != fmt.Sprint(want) {
		t.Errorf("statement %s of %s about %v, want an in-toto v1 SLSA provenance v1 about %v", st.Type, st.PredicateType, subjects, want)
	}
}

// TestVerifyCommand runs `release verify` as docs/releasing.md tells a user to, with the
// release's public key. The release ran it before it finished, and said so. (That it fails with
// another key, or on any tampering, deploy/release's unit tests check: no second build here.)
func TestVerifyCommand(t *testing.T) {
	dir := release(t)
	if strings.Contains(released.stderr, "UNSIGNED") || !strings.Contains(released.stderr, "verify: image index sha256:") {
		t.Errorf("the signed release's output:\n%s", released.stderr)
	}
	cmd := exec.Command("go", "run", "./deploy/release", "verify", "--dir", dir, "--key", filepath.Join(dir, "cosign.pub"))
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	for _, want := range []string{"SHA256SUMS.sig: the key signed SHA256SUMS", "the key signed it", "provenance: its subjects are", "SBOM: it lists", "chart: a default install pulls the image by its digest"} {
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("release verify --key cosign.pub: %v, want %q:\n%s", err, want, out)
			break
		}
	}
}
