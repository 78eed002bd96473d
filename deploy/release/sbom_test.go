package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/health-router/health-router/deploy/cabundle"
)

func TestPurl(t *testing.T) {
	for _, tt := range []struct{ path, version, want string }{
		{"sigs.k8s.io/karpenter", "v1.15.0", "pkg:golang/sigs.k8s.io/karpenter@v1.15.0"},
		{"github.com/aws/aws-sdk-go-v2/service/ec2", "v1.336.1", "pkg:golang/github.com/aws/aws-sdk-go-v2/service/ec2@v1.336.1"},
		{"github.com/Azure/go-ansiterm", "v0.0.0-20250102033503-faa5f7b0171c", "pkg:golang/github.com/Azure/go-ansiterm@v0.0.0-20250102033503-faa5f7b0171c"},
		{"github.com/docker/cli", "v29.7.2+incompatible", "pkg:golang/github.com/docker/cli@v29.7.2%2Bincompatible"},
		{"gopkg.in/inf.v0", "v0.9.1", "pkg:golang/gopkg.in/inf.v0@v0.9.1"},
		{"stdlib", "go1.26.10", "pkg:golang/stdlib@go1.26.10"},
		{"example.com/a b", "v1.0.0", "pkg:golang/example.com/a%20b@v1.0.0"},
	} {
		if got := purl(tt.path, tt.version); got != tt.want {
			t.Errorf("purl(%q, %q) = %q, want %q", tt.path, tt.version, got, tt.want)
		}
	}
}

func TestModuleOf(t *testing.T) {
	for _, tt := range []struct {
		in   debug.Module
		want module
	}{
		{debug.Module{Path: "a.io/x", Version: "v1.0.0"}, module{path: "a.io/x", version: "v1.0.0"}},
		// What went in is the replacement's version, under the path the code imports.
		{debug.Module{Path: "a.io/x", Version: "v1.43.1", Replace: &debug.Module{Path: "a.io/x", Version: "v1.35.25"}}, module{path: "a.io/x", version: "v1.35.25", replacedBy: "a.io/x"}},
		{debug.Module{Path: "a.io/x", Version: "v1.0.0", Replace: &debug.Module{Path: "../x"}}, module{path: "a.io/x", version: "(devel)", replacedBy: "../x"}},
	} {
		if got := moduleOf(&tt.in); got != tt.want {
			t.Errorf("moduleOf(%+v) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

// testBinary is this test's own executable: a Go binary with build information, its modules
// listed by runtime/debug for the test to compare with.
func testBinary(t *testing.T) ([]byte, *debug.BuildInfo) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok || len(bi.Deps) == 0 {
		t.Fatal("the test binary has no build information with modules")
	}
	return b, bi
}

func TestSPDXDocument(t *testing.T) {
	bin, bi := testBinary(t)
	digest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	o := options{version: "1.2.3", revision: "0123abc", source: "https://github.com/health-router/health-router", epoch: time.Unix(1763726400, 0)}
	// Two platforms with the same modules: each module is listed once.
	ca := cabundle.Pinned()
	img := image{desc: v1.Descriptor{Digest: digest}, binaries: map[platform][]byte{{"linux", "amd64"}: bin, {"linux", "arm64"}: bin}, caBundles: map[platform][]byte{{"linux", "amd64"}: ca, {"linux", "arm64"}: ca}}
	raw, err := spdxDocument(o, img)
	if err != nil {
		t.Fatal(err)
	}
	again, err := spdxDocument(o, img)
	if err != nil || string(again) != string(raw) {
		t.Errorf("a second SBOM of the same binaries differs (err %v)", err)
	}
	var doc spdxDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.DataLicense != "CC0-1.0" || doc.SPDXID != "SPDXRef-DOCUMENT" {
		t.Errorf("header %+v", doc)
	}
	if doc.CreationInfo.Created != "2025-11-21T12:00:00Z" {
		t.Errorf("created %q, want SOURCE_DATE_EPOCH", doc.CreationInfo.Created)
	}
	if !strings.HasSuffix(doc.DocumentNamespace, digest.Hex) || !strings.Contains(doc.CreationInfo.Comment, "linux/amd64, linux/arm64") {
		t.Errorf("namespace %q comment %q: want the index digest and the platforms", doc.DocumentNamespace, doc.CreationInfo.Comment)
	}

	// Every module of the binary, once, with its purl; the standard library at Go's version.
	idOK := regexp.MustCompile(`^SPDXRef-[A-Za-z0-9.-]+$`)
	ids := map[string]bool{}
	byPurl := map[string]int{}
	for _, p := range doc.Packages {
		if !idOK.MatchString(p.SPDXID) || ids[p.SPDXID] {
			t.Errorf("package %s: SPDXID %q invalid or used twice", p.Name, p.SPDXID)
		}
		ids[p.SPDXID] = true
		if p.Name == "ca-certificates" { // a file, not a Go module: checked below
			continue
		}
		if p.FilesAnalyzed || p.DownloadLocation == "" || len(p.ExternalRefs) != 1 {
			t.Errorf("package %+v", p)
			continue
		}
		byPurl[p.ExternalRefs[0].ReferenceLocator]++
	}
	if len(doc.Packages) != len(bi.Deps)+3 {
		t.Errorf("%d packages, want the %d modules, the standard library, the CA bundle and health-router", len(doc.Packages), len(bi.Deps))
	}
	for _, d := range bi.Deps {
		m := moduleOf(d)
		if n := byPurl[purl(m.path, m.version)]; n != 1 {
			t.Errorf("module %s %s: listed %d times, want once", m.path, m.version, n)
		}
	}
	for _, want := range []string{"pkg:golang/stdlib@" + bi.GoVersion, "pkg:golang/github.com/health-router/health-router@v1.2.3"} {
		if byPurl[want] != 1 {
			t.Errorf("no package %s", want)
		}
	}
	// The CA bundle: the module it comes from at the version this build has, and its SHA-256.
	caVersion, err := cabundle.Version()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(ca)
	var caPkg *spdxPackage
	for i, p := range doc.Packages {
		if p.Name == "ca-certificates" {
			caPkg = &doc.Packages[i]
		}
	}
	if caPkg == nil || caPkg.VersionInfo != caVersion || caPkg.PackageFileName != cabundle.Path || len(caPkg.Checksums) != 1 ||
		caPkg.Checksums[0] != (spdxSum{"SHA256", hex.EncodeToString(sum[:])}) || !strings.Contains(caPkg.SourceInfo, cabundle.Module+" "+caVersion) {
		t.Errorf("the CA bundle's package %+v: want %s %s, its SHA-256 %x, at %s", caPkg, cabundle.Module, caVersion, sum, cabundle.Path)
	}

	if main := doc.Packages[0]; main.LicenseDeclared != "Apache-2.0" || !strings.HasSuffix(main.DownloadLocation, "@0123abc") || main.PrimaryPackagePurpose != "APPLICATION" {
		t.Errorf("the application's package %+v", main)
	}

	// The document describes health-router, which depends on every other package.
	depends := map[string]bool{}
	for _, r := range doc.Relationships {
		if !ids[r.RelatedSPDXElement] {
			t.Errorf("relationship %+v names no package", r)
		}
		switch {
		case r.SPDXElementID == "SPDXRef-DOCUMENT" && r.RelationshipType == "DESCRIBES":
			if r.RelatedSPDXElement != doc.Packages[0].SPDXID {
				t.Errorf("the document describes %s", r.RelatedSPDXElement)
			}
		case r.SPDXElementID == doc.Packages[0].SPDXID && r.RelationshipType == "DEPENDS_ON":
			depends[r.RelatedSPDXElement] = true
		default:
			t.Errorf("relationship %+v", r)
		}
	}
	if len(depends) != len(doc.Packages)-1 {
		t.Errorf("health-router depends on %d packages, want %d", len(depends), len(doc.Packages)-1)
	}
}

func TestSPDXDocumentRefusesAnotherCABundle(t *testing.T) {
	bin, _ := testBinary(t)
	img := image{binaries: map[platform][]byte{{"linux", "amd64"}: bin}, caBundles: map[platform][]byte{{"linux", "amd64"}: []byte("-----BEGIN CERTIFICATE-----\n")}}
	if _, err := spdxDocument(options{version: "1.2.3"}, img); err == nil || !strings.Contains(err.Error(), "not the CA bundle go.mod pins") {
		t.Errorf("an SBOM of an image with another CA bundle: %v, want an error", err)
	}
}

func TestSPDXDocumentRefusesNonGo(t *testing.T) {
	img := image{binaries: map[platform][]byte{{"linux", "amd64"}: []byte("#!/bin/sh\n")}}
	if _, err := spdxDocument(options{}, img); err == nil {
		t.Error("an SBOM of a binary without build information: want an error")
	}
}

// TestCheckSBOM: the check `release verify` makes of the SBOM against the image fails when the
// SBOM lacks a module of a binary, the standard library, or the CA bundle.
func TestCheckSBOM(t *testing.T) {
	bin, bi := testBinary(t)
	ca := cabundle.Pinned()
	img := image{desc: v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}},
		binaries: map[platform][]byte{{"linux", "amd64"}: bin}, caBundles: map[platform][]byte{{"linux", "amd64"}: ca}}
	raw, err := spdxDocument(options{version: "1.2.3", revision: "abc", source: "https://example.com/hr", epoch: time.Unix(0, 0)}, img)
	if err != nil {
		t.Fatal(err)
	}
	dep := moduleOf(bi.Deps[len(bi.Deps)/2])
	without := func(drop func(p spdxPackage) bool) []byte {
		var doc spdxDoc
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		var kept []spdxPackage
		for _, p := range doc.Packages {
			if !drop(p) {
				kept = append(kept, p)
			}
		}
		if len(kept) != len(doc.Packages)-1 {
			t.Fatalf("dropped %d packages, want one", len(doc.Packages)-len(kept))
		}
		doc.Packages = kept
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	otherCA := image{desc: img.desc, binaries: img.binaries, caBundles: map[platform][]byte{{"linux", "amd64"}: append(slices.Clone(ca), '\n')}}
	for _, tt := range []struct {
		name    string
		sbom    []byte
		img     image
		wantErr string
	}{
		{name: "complete", sbom: raw, img: img},
		{name: "a module missing", sbom: without(func(p spdxPackage) bool { return p.Name == dep.path && p.VersionInfo == dep.version }), img: img, wantErr: "does not list the module " + dep.path + " " + dep.version},
		{name: "the standard library missing", sbom: without(func(p spdxPackage) bool { return p.Name == "stdlib" }), img: img, wantErr: "Go standard library"},
		{name: "the CA bundle missing", sbom: without(func(p spdxPackage) bool { return p.Name == "ca-certificates" }), img: img, wantErr: "CA bundle"},
		{name: "another CA bundle in the image", sbom: raw, img: otherCA, wantErr: "CA bundle"},
		{name: "not JSON", sbom: []byte("SPDXVersion: SPDX-2.3"), img: img, wantErr: "reading the SBOM"},
	} {
		err := checkSBOM(tt.sbom, tt.img)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
		}
	}
}
