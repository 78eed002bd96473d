package main

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/health-router/health-router/deploy/cabundle"
)

// The SBOM is an SPDX 2.3 JSON document (spdx.github.io/spdx-spec/v2.3) written from the
// build information Go puts in every binary (debug/buildinfo: what `go version -m` prints):
// the modules that went into the binary, each a package with its purl, and the Go standard
// library at the toolchain's version, as syft and Trivy list a Go binary's. The image's one
// other content that is not ours, the CA bundle (deploy/cabundle), is a package too, with the
// version of the module it comes from and its SHA-256.

// spdxDoc is the part of an SPDX 2.3 document the SBOM fills.
type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
	Comment  string   `json:"comment,omitempty"`
}

type spdxPackage struct {
	Name                  string       `json:"name"`
	SPDXID                string       `json:"SPDXID"`
	VersionInfo           string       `json:"versionInfo"`
	DownloadLocation      string       `json:"downloadLocation"`
	FilesAnalyzed         bool         `json:"filesAnalyzed"`
	LicenseDeclared       string       `json:"licenseDeclared,omitempty"`
	PackageFileName       string       `json:"packageFileName,omitempty"`
	SourceInfo            string       `json:"sourceInfo,omitempty"`
	Checksums             []spdxSum    `json:"checksums,omitempty"`
	PrimaryPackagePurpose string       `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs          []spdxExtRef `json:"externalRefs,omitempty"`
	Comment               string       `json:"comment,omitempty"`
}

type spdxSum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExtRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// module is one Go module in the binaries: the path the build asked for and the version that
// went in (a replacement's, when go.mod replaces it).
type module struct {
	path, version, replacedBy string
}

// modules reads the build information of each binary and returns the Go version and the
// union of their modules, sorted; binaries built by different Go versions are an error (one
// release, one toolchain).
func modules(binaries map[platform][]byte) (string, []module, error) {
	goVersion := ""
	seen := map[module]bool{}
	var out []module
	for _, p := range sortedPlatforms(binaries) {
		bi, err := buildinfo.Read(bytes.NewReader(binaries[p]))
		if err != nil {
			return "", nil, fmt.Errorf("reading the build information of the %s binary: %w", p, err)
		}
		if goVersion != "" && bi.GoVersion != goVersion {
			return "", nil, fmt.Errorf("the %s binary was built by %s, another by %s", p, bi.GoVersion, goVersion)
		}
		goVersion = bi.GoVersion
		for _, d := range bi.Deps {
			m := moduleOf(d)
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	slices.SortFunc(out, func(a, b module) int {
		return cmp.Or(cmp.Compare(a.path, b.path), cmp.Compare(a.version, b.version))
	})
	return goVersion, out, nil
}

func moduleOf(d *debug.Module) module {
	if d.Replace == nil {
		return module{path: d.Path, version: d.Version}
	}
	m := module{path: d.Path, version: d.Replace.Version, replacedBy: d.Replace.Path}
	if m.version == "" { // replaced by a directory: no version to name
		m.version = "(devel)"
	}
	return m
}

func sortedPlatforms[V any](m map[platform]V) []platform {
	var ps []platform
	for p := range m {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b platform) int { return cmp.Compare(a.String(), b.String()) })
	return ps
}

// purl is a Go module's package URL (github.com/package-url/purl-spec, type golang): the
// path's segments and the version percent-encoded.
func purl(path, version string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = purlEscape(s)
	}
	return "pkg:golang/" + strings.Join(segs, "/") + "@" + purlEscape(version)
}

// purlEscape percent-encodes all but the characters a purl component keeps as they are.
func purlEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == '_', c == '~':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// spdxIDChars are the characters an SPDX identifier may not hold after "SPDXRef-".
var spdxIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

// spdxDocument is the SBOM of the image: its binaries' modules, described as the packages of
// the health-router application at the release's version and revision.
func spdxDocument(o options, img image) ([]byte, error) {
	goVersion, mods, err := modules(img.binaries)
	if err != nil {
		return nil, err
	}
	const mainID = "SPDXRef-Package-health-router"
	main := spdxPackage{
		Name:                  "health-router",
		SPDXID:                mainID,
		VersionInfo:           o.version,
		DownloadLocation:      "git+" + o.source + "@" + o.revision,
		LicenseDeclared:       "Apache-2.0",
		PrimaryPackagePurpose: "APPLICATION",
		ExternalRefs:          []spdxExtRef{{"PACKAGE-MANAGER", "purl", purl("github.com/health-router/health-router", "v"+o.version)}},
		Comment:               "the binary of the image index " + img.desc.Digest.String(),
	}
	doc := spdxDoc{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              "health-router-" + o.version,
		DocumentNamespace: o.source + "/spdx/health-router-" + o.version + "-" + img.desc.Digest.Hex,
		CreationInfo: spdxCreationInfo{
			Created:  o.epoch.UTC().Format(time.RFC3339),
			Creators: []string{"Organization: health-router", "Tool: health-router-deploy-release"},
			Comment:  fmt.Sprintf("The Go modules of the health-router binaries in the image index %s (%s), from their build information, and the images' CA bundle.", img.desc.Digest, strings.Join(platformNames(img.binaries), ", ")),
		},
		Packages:      []spdxPackage{main},
		Relationships: []spdxRelationship{{"SPDXRef-DOCUMENT", "DESCRIBES", mainID}},
	}
	ids := map[string]bool{mainID: true}
	add := func(p spdxPackage) {
		id := p.SPDXID
		for n := 2; ids[id]; n++ { // two names that differ only in characters an ID cannot hold
			id = fmt.Sprintf("%s-%d", p.SPDXID, n)
		}
		ids[id] = true
		p.SPDXID = id
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{mainID, "DEPENDS_ON", id})
	}
	add(spdxPackage{
		Name:                  "stdlib",
		SPDXID:                "SPDXRef-Package-go-stdlib",
		VersionInfo:           goVersion,
		DownloadLocation:      "https://go.dev/dl/",
		PrimaryPackagePurpose: "LIBRARY",
		ExternalRefs:          []spdxExtRef{{"PACKAGE-MANAGER", "purl", purl("stdlib", goVersion)}},
		Comment:               "the Go standard library and runtime the binaries are built with",
	})
	ca, err := caPackage(img)
	if err != nil {
		return nil, err
	}
	add(ca)
	for _, m := range mods {
		p := spdxPackage{
			Name:                  m.path,
			SPDXID:                "SPDXRef-Package-go-module-" + strings.Trim(spdxIDChars.ReplaceAllString(m.path+"-"+m.version, "-"), "-"),
			VersionInfo:           m.version,
			DownloadLocation:      "NOASSERTION",
			PrimaryPackagePurpose: "LIBRARY",
			ExternalRefs:          []spdxExtRef{{"PACKAGE-MANAGER", "purl", purl(m.path, m.version)}},
		}
		if m.replacedBy != "" {
			p.Comment = "replaced by " + m.replacedBy + " " + m.version + " (go.mod)"
		}
		add(p)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// caPackage is the SBOM's package of the image's CA bundle: the file every image of the index
// has at cabundle.Path, which must be the bundle go.mod pins (deploy/release never asks
// deploy/image for another), named by the module it comes from and its SHA-256.
func caPackage(img image) (spdxPackage, error) {
	pinned := cabundle.Pinned()
	for _, p := range sortedPlatforms(img.binaries) {
		if !bytes.Equal(img.caBundles[p], pinned) {
			return spdxPackage{}, fmt.Errorf("the %s image's %s is not the CA bundle go.mod pins (%s)", p, cabundle.Path, cabundle.Module)
		}
	}
	v, err := cabundle.Version()
	if err != nil {
		return spdxPackage{}, err
	}
	sum := sha256.Sum256(pinned)
	// No purl: the file is not the Go module (which the binaries may hold too, under its purl).
	return spdxPackage{
		Name:                  "ca-certificates",
		SPDXID:                "SPDXRef-Package-ca-certificates",
		VersionInfo:           v,
		DownloadLocation:      "NOASSERTION",
		PackageFileName:       cabundle.Path,
		SourceInfo:            "the roots of the Go module " + cabundle.Module + " " + v + " (Mozilla's), PEM-encoded by deploy/image",
		Checksums:             []spdxSum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(sum[:])}},
		PrimaryPackagePurpose: "FILE",
		Comment:               "the CA certificate bundle of every image in the index, at " + cabundle.Path + " (SSL_CERT_FILE)",
	}, nil
}

func platformNames[V any](m map[platform]V) []string {
	var out []string
	for _, p := range sortedPlatforms(m) {
		out = append(out, p.String())
	}
	return out
}

// checkSBOM checks that the SBOM lists what the image holds: every module of every platform's
// binary at the version that went in and the Go standard library at the binaries' Go version,
// all read again from their build information, and each image's CA bundle by its SHA-256.
func checkSBOM(raw []byte, img image) error {
	var doc spdxDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("reading the SBOM: %w", err)
	}
	purls, sums := map[string]bool{}, map[string]bool{}
	for _, p := range doc.Packages {
		for _, r := range p.ExternalRefs {
			if r.ReferenceType == "purl" {
				purls[r.ReferenceLocator] = true
			}
		}
		for _, c := range p.Checksums {
			if c.Algorithm == "SHA256" {
				sums[strings.ToLower(c.ChecksumValue)] = true
			}
		}
	}
	goVersion, mods, err := modules(img.binaries)
	if err != nil {
		return err
	}
	var errs []error
	if !purls[purl("stdlib", goVersion)] {
		errs = append(errs, fmt.Errorf("the SBOM does not list the Go standard library at %s, the binaries' Go", goVersion))
	}
	for _, m := range mods {
		if !purls[purl(m.path, m.version)] {
			errs = append(errs, fmt.Errorf("the SBOM does not list the module %s %s, which the binaries hold", m.path, m.version))
		}
	}
	for _, p := range sortedPlatforms(img.caBundles) {
		sum := sha256.Sum256(img.caBundles[p])
		if !sums[hex.EncodeToString(sum[:])] {
			errs = append(errs, fmt.Errorf("the SBOM lists no package with the SHA-256 %x of the %s image's CA bundle", sum, p))
		}
	}
	return errors.Join(errs...)
}
