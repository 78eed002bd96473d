package image_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// hostBundle is where Debian's ca-certificates, and so a builder, keeps the CA bundle.
const hostBundle = "/etc/ssl/certs/ca-certificates.crt"

// TestOneDigestAcrossBuilders builds the image as two builders would whose machines hold
// different CA bundles (one updated ca-certificates, one not): each build runs in its own mount
// namespace with another file at the bundle's path. One commit must give one digest: the image
// carries the CA bundle pinned by go.mod, never the builder's.
func TestOneDigestAcrossBuilders(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image twice")
	}
	if err := exec.Command("unshare", "-m", "true").Run(); err != nil {
		t.Skipf("SKIPPED LOUDLY: cannot make a mount namespace (unshare -m, needs root): %v", err)
	}
	host, err := os.ReadFile(hostBundle)
	if err != nil {
		t.Skipf("SKIPPED LOUDLY: no CA bundle at %s to vary: %v", hostBundle, err)
	}
	// Another builder's bundle: the first certificate only (an older or a trimmed one).
	first, _, ok := bytes.Cut(host, []byte("-----END CERTIFICATE-----\n"))
	if !ok {
		t.Fatalf("%s holds no PEM certificate", hostBundle)
	}
	dir := t.TempDir()
	bundles := map[string][]byte{"builder-a": host, "builder-b": append(first, []byte("-----END CERTIFICATE-----\n")...)}
	digests := map[string]string{}
	for name, bundle := range bundles {
		path := filepath.Join(dir, name+".crt")
		if err := os.WriteFile(path, bundle, 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := buildAs(t, path, filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		digests[name] = d
	}
	if digests["builder-a"] != digests["builder-b"] {
		t.Errorf("one commit, two builders' CA bundles: digests %s and %s", digests["builder-a"], digests["builder-b"])
	}
}

// buildAs builds the image for linux/amd64 in a mount namespace where bundle is at hostBundle.
func buildAs(t *testing.T, bundle, out string) (string, error) {
	t.Helper()
	script := `mount --bind "$1" ` + hostBundle + ` && exec go run ./deploy/image build --out "$2" --version ` + version +
		` --revision ` + revision + ` --source ` + source + ` --platforms linux/amd64`
	cmd := exec.Command("unshare", "-m", "sh", "-c", script, "sh", bundle, out)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(epoch, 10))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", errors.New("deploy/image build: " + err.Error() + "\n" + stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// pinnedBundle is the bundle the image must carry: the fallback module's roots without a
// distrust-after date, PEM-encoded in its order. It must hold Amazon's roots (AWS's endpoints)
// and every certificate must parse.
func pinnedBundle(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	amazon := false
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		c, err := x509.ParseCertificate(r.Certificate)
		if err != nil {
			t.Fatalf("a pinned root does not parse: %v", err)
		}
		amazon = amazon || c.Subject.CommonName == "Amazon Root CA 1"
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			t.Fatal(err)
		}
	}
	if !amazon {
		t.Error("the pinned bundle has no Amazon Root CA 1: the router could not reach AWS")
	}
	return b.Bytes()
}
