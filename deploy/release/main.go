// Command release writes into one directory what a release of health-router publishes, built
// on this machine with nothing but the Go module proxy and the caches, and verifies it:
//
//	image/                                          the multi-platform image (deploy/image) as an OCI layout, with
//	                                                its SBOM and provenance attached as artifacts referring to the
//	                                                index and, signed, cosign's signature and attestation
//	health-router_<version>_sbom.spdx.json          that SBOM: SPDX 2.3, the Go modules of the image's binaries, its CA bundle
//	health-router_<version>_provenance.intoto.json  that provenance: an in-toto statement of SLSA provenance v1
//	health-router-<version>.tgz                     the Helm chart, packaged by helm, pulling the image by digest
//	health-router_<version>_<os>_<arch>.tar.gz      the CLI: the binary, LICENSE, README.md
//	SHA256SUMS                                      every other file's SHA-256, as sha256sum -c reads it
//
// and, with a signing key (--signing-key), signed as cosign signs with one:
//
//	health-router_<version>_provenance.dsse.json    the provenance signed: a DSSE envelope
//	SHA256SUMS.sig                                  SHA256SUMS signed, as cosign sign-blob writes it
//	cosign.pub                                      the public key
//
//	go run ./deploy/release --out bin/release --version v0.1.0 --revision $(git rev-parse HEAD) --helm $(test/tools/helm-bin.sh) [--signing-key cosign.key]
//	go run ./deploy/release verify --dir bin/release [--key cosign.pub]
//
// Every file is reproducible: its timestamps are SOURCE_DATE_EPOCH (the commit time, from the
// Makefile), its entries in a fixed order with fixed owners and modes, the binaries built by
// deploy/gobuild, the signatures deterministic. A linux CLI archive holds the image's own
// binary for that platform, taken out of the image rather than built again, so the two cannot
// differ and the build is not repeated. Before it finishes, the release verifies what it wrote
// as `release verify` does (verify.go).
package main

import (
	"crypto/ecdsa"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/health-router/health-router/deploy/gobuild"
	"github.com/health-router/health-router/router/version"
)

// The release's names, from the version without its "v" (as the chart's version and
// appVersion and so the image tag the chart asks for by default, as Karpenter's releases do).
const (
	imageDir = "image"
	sumsFile = "SHA256SUMS"
)

func sbomFile(version string) string { return "health-router_" + version + "_sbom.spdx.json" }
func provenanceFile(version string) string {
	return "health-router_" + version + "_provenance.intoto.json"
}
func envelopeFile(version string) string { return "health-router_" + version + "_provenance.dsse.json" }
func chartFile(version string) string    { return "health-router-" + version + ".tgz" }
func cliFile(version string, p platform) string {
	return fmt.Sprintf("health-router_%s_%s_%s.tar.gz", version, p.os, p.arch)
}

// platform is a Go os/arch pair.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// parsePlatforms reads a comma-separated os/arch list; "host" is the platform this runs on.
func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "host" {
			f = runtime.GOOS + "/" + runtime.GOARCH
		}
		goos, goarch, ok := strings.Cut(f, "/")
		if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
			return nil, fmt.Errorf("%q is not os/arch", f)
		}
		p := platform{goos, goarch}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("%s twice", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// releaseVersion is the version the release's files carry: SemVer 2 (a leading "v" is
// dropped), as helm requires of a chart's version.
func releaseVersion(s string) (string, error) {
	v, err := semver.StrictNewVersion(strings.TrimPrefix(s, "v"))
	if err != nil {
		return "", fmt.Errorf("--version %q is not a semantic version (v1.2.3, v1.2.3-rc.1): %w", s, err)
	}
	return v.String(), nil
}

// options are the flags.
type options struct {
	out, version, revision, source string
	pkg, chart, helm, license      string
	readme                         string
	platforms, imagePlatforms      []platform
	epoch                          time.Time
	// invocation and builderID are what the provenance says built the release.
	invocation, builderID string
	// imageRepository is where the chart pulls the image from (its values.yaml).
	imageRepository string
	// key signs the release; nil: it is unsigned.
	key *ecdsa.PrivateKey
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "verify" {
		return runVerify(args[1:], os.Stdout)
	}
	o, err := parse(args)
	if err != nil {
		return err
	}
	return release(o)
}

func parse(args []string) (options, error) {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.out, "out", "bin/release", "directory to write (replaced)")
	fs.StringVar(&o.version, "version", "", "the release's version, SemVer with or without a leading v (required)")
	fs.StringVar(&o.revision, "revision", "", "the commit the release is built from (required)")
	fs.StringVar(&o.source, "source", "https://github.com/health-router/health-router", "the source repository's URL")
	fs.StringVar(&o.pkg, "package", "./cmd/health-router", "the main package")
	fs.StringVar(&o.chart, "chart", "deploy/charts/health-router", "the chart directory")
	fs.StringVar(&o.helm, "helm", os.Getenv("HELM_BIN"), "the helm binary (default $HELM_BIN; make release passes test/tools/helm-bin.sh's)")
	fs.StringVar(&o.license, "license", "LICENSE", "the LICENSE file the CLI archives carry")
	fs.StringVar(&o.readme, "readme", "README.md", "the README the CLI archives carry")
	fs.StringVar(&o.invocation, "invocation", "go run ./deploy/release", "how the release was asked for, for the provenance (make release passes its own)")
	fs.StringVar(&o.builderID, "builder-id", defaultBuilderID, "the provenance's builder id: who ran the build (a CI system's URI)")
	signingKey := fs.String("signing-key", "", "a PEM ECDSA P-256 private key (PKCS #8, EC, or cosign's encrypted key with COSIGN_PASSWORD) to sign the release with; none: unsigned")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64", "comma-separated os/arch list of the CLI archives; host: this machine's")
	imagePlatforms := fs.String("image-platforms", "linux/amd64,linux/arm64", "comma-separated linux/arch list of the image")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.version, err = releaseVersion(o.version); err != nil {
		return o, err
	}
	if o.revision == "" {
		return o, errors.New("--revision is required (the commit the release is built from)")
	}
	if o.helm == "" {
		return o, errors.New("--helm is required (or HELM_BIN): helm packages the chart")
	}
	if o.platforms, err = parsePlatforms(*platforms); err != nil {
		return o, fmt.Errorf("--platforms: %w", err)
	}
	if o.imagePlatforms, err = parsePlatforms(*imagePlatforms); err != nil {
		return o, fmt.Errorf("--image-platforms: %w", err)
	}
	for _, p := range o.imagePlatforms {
		if p.os != "linux" {
			return o, fmt.Errorf("--image-platforms: %s is not linux/<arch>", p)
		}
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return o, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970 (the Makefile sets it to the commit time), so that the release is reproducible", epoch)
	}
	o.epoch = time.Unix(secs, 0).UTC()
	if o.imageRepository, err = chartRepository(o.chart); err != nil {
		return o, fmt.Errorf("--chart: %w", err)
	}
	if *signingKey != "" {
		raw, err := os.ReadFile(*signingKey)
		if err != nil {
			return o, fmt.Errorf("--signing-key: %w", err)
		}
		var password []byte
		if p, ok := os.LookupEnv("COSIGN_PASSWORD"); ok {
			password = []byte(p)
		}
		if o.key, err = loadSigningKey(raw, password); err != nil {
			return o, fmt.Errorf("--signing-key %s: %w", *signingKey, err)
		}
	}
	return o, nil
}

// release writes every file, then SHA256SUMS over them, and lists them with their sizes.
func release(o options) error {
	if err := os.RemoveAll(o.out); err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "health-router-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// A full release takes minutes, most of them compiling: each step says what it builds, on
	// stderr (stdout is the listing of the files).
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "release: [%s] %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
	}

	// The image, by deploy/image itself: one way to build it, whether for `make image` or here.
	var names []string
	for _, p := range o.imagePlatforms {
		names = append(names, p.String())
	}
	layoutDir := filepath.Join(o.out, imageDir)
	step("building the image %s for %s (deploy/image): the longest step", o.version, strings.Join(names, ", "))
	cmd := exec.Command("go", "run", "./deploy/image", "build", "--out", layoutDir, "--package", o.pkg,
		"--platforms", strings.Join(names, ","), "--version", o.version, "--revision", o.revision, "--source", o.source)
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("building the image (deploy/image): %w\n%s", err, out)
	}

	img, err := openImage(layoutDir, o.version)
	if err != nil {
		return err
	}
	step("writing the SBOM of image index %s", img.desc.Digest)
	sbom, err := spdxDocument(o, img)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, sbomFile(o.version)), sbom, 0o644); err != nil {
		return err
	}
	if err := attachArtifact(layoutDir, img.desc, spdxMediaType, sbom, sbomFile(o.version), o.epoch); err != nil {
		return fmt.Errorf("attaching the SBOM to %s: %w", layoutDir, err)
	}

	step("packaging the chart %s (helm), pulling the image by its digest", o.chart)
	if err := packageChart(o, work, img.desc.Digest); err != nil {
		return err
	}

	license, err := os.ReadFile(o.license)
	if err != nil {
		return err
	}
	readme, err := os.ReadFile(o.readme)
	if err != nil {
		return err
	}
	for _, p := range o.platforms {
		bin, ok := img.binaries[p]
		if ok {
			step("the CLI archive for %s/%s, of the image's binary", p.os, p.arch)
		} else {
			step("the CLI archive for %s/%s: compiling", p.os, p.arch)
		}
		if !ok {
			path := filepath.Join(work, "health-router-"+p.os+"-"+p.arch)
			if err := gobuild.Build(o.pkg, p.os, p.arch, path, version.LDFlags(o.version, o.revision)); err != nil {
				return err
			}
			if bin, err = os.ReadFile(path); err != nil {
				return err
			}
		}
		archive, err := tarGz(o.epoch, nil, []archiveFile{
			{name: "health-router", mode: 0o755, body: bin},
			{name: "LICENSE", mode: 0o644, body: license},
			{name: "README.md", mode: 0o644, body: readme},
		})
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.out, cliFile(o.version, p)), archive, 0o644); err != nil {
			return err
		}
	}

	if err := seal(o, img, os.Stderr, step); err != nil {
		return err
	}
	fmt.Printf("health-router %s (%s): image index %s\n", o.version, o.revision, img.desc.Digest)
	return listing(os.Stdout, o.out)
}

// seal finishes a release whose image, SBOM, chart and archives are in o.out: it writes the
// provenance of them, signs (with a key), writes SHA256SUMS over everything, signs it, and
// verifies the whole as `release verify` does, saying so on w. Unsigned, it says that too.
func seal(o options, img image, w io.Writer, step func(format string, args ...any)) error {
	layoutDir := filepath.Join(o.out, imageDir)
	step("writing the provenance")
	goVersion, _, err := modules(img.binaries)
	if err != nil {
		return err
	}
	files, err := releaseFiles(o.out, o.version)
	if err != nil {
		return err
	}
	statement, err := provenance(o, img, goVersion, files)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, provenanceFile(o.version)), statement, 0o644); err != nil {
		return err
	}
	if err := attachArtifact(layoutDir, img.desc, intotoMediaType, statement, provenanceFile(o.version), o.epoch); err != nil {
		return fmt.Errorf("attaching the provenance to %s: %w", layoutDir, err)
	}
	if err := markIndex(layoutDir, img.desc.Digest); err != nil {
		return err
	}
	if o.key != nil {
		step("signing the image index and the provenance")
		if err := sign(o, img, statement); err != nil {
			return err
		}
	}

	step("writing %s", sumsFile)
	sums, err := checksums(os.DirFS(o.out))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, sumsFile), sums, 0o644); err != nil {
		return err
	}
	var pub *ecdsa.PublicKey
	if o.key != nil {
		pub = &o.key.PublicKey
		sig, err := signBlob(o.key, sums)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.out, sumsSigFile), sig, 0o644); err != nil {
			return err
		}
	}

	step("verifying the release (release verify)")
	if err := verifyRelease(o.out, pub, w); err != nil {
		return fmt.Errorf("the release in %s does not verify: %w", o.out, err)
	}
	if o.key == nil {
		fmt.Fprintln(w, "release: UNSIGNED: no signing key (make release SIGNING_KEY=cosign.key), so no signature, no cosign.pub, no signed provenance")
	}
	return nil
}
