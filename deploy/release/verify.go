package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"sigs.k8s.io/yaml"
)

// runVerify is `release verify`: a release directory checked offline, with the public key the
// user trusts (--key) or, without one, everything but the signatures.
func runVerify(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	dir := fs.String("dir", "bin/release", "the release directory")
	keyFile := fs.String("key", "", "the public key the release is signed with (cosign.pub, from a source you trust); without it the signatures are not checked")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var key *ecdsa.PublicKey
	if *keyFile != "" {
		raw, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("--key: %w", err)
		}
		if key, err = loadPublicKey(raw); err != nil {
			return fmt.Errorf("--key %s: %w", *keyFile, err)
		}
	}
	return verifyRelease(*dir, key, w)
}

// verifyRelease checks a release, offline: SHA256SUMS matches every file and lists them all,
// the layout's blobs have their digests; with a key, the signatures of SHA256SUMS, of the image
// index and of the provenance verify; the provenance's subjects are the image index and the
// files; the SBOM lists every module of every binary in the image and its CA bundle; the chart
// pulls the image by the index's digest. It says on w what it checked, and returns every
// failure at once.
func verifyRelease(dir string, key *ecdsa.PublicKey, w io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(w, "verify: "+format+"\n", args...) }
	var errs []error
	check := func(err error, format string, args ...any) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		say(format, args...)
	}

	sums, err := os.ReadFile(filepath.Join(dir, sumsFile))
	if err != nil {
		return err
	}
	n, err := checkSums(dir, sums)
	check(err, "%s: the %d files match it, and it lists every file", sumsFile, n)
	if key != nil {
		sig, err := os.ReadFile(filepath.Join(dir, sumsSigFile))
		if err == nil {
			err = verifyBlob(key, sums, sig)
		}
		check(errorf(err, "%s", sumsSigFile), "%s: the key signed %s", sumsSigFile, sumsFile)
	}

	layoutDir := filepath.Join(dir, imageDir)
	index, version, err := imageIndex(layoutDir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	check(checkBlobs(layoutDir), "%s: every blob has its digest", imageDir)
	img, err := openImage(layoutDir, version)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if key != nil {
		check(verifyImageSignature(layoutDir, index, key), "image index %s: the key signed it (%s)", index.Digest, cosignTag(index.Digest, "sig"))
	}

	statement, err := os.ReadFile(filepath.Join(dir, provenanceFile(version)))
	if err == nil {
		err = verifyProvenance(dir, layoutDir, version, index, statement, key)
	}
	signed := ""
	if key != nil {
		signed = ", the key signed it (" + envelopeFile(version) + ", " + cosignTag(index.Digest, "att") + ")"
	}
	check(errorf(err, "the provenance"), "provenance: its subjects are the image index and every file%s", signed)

	sbom, err := os.ReadFile(filepath.Join(dir, sbomFile(version)))
	if err == nil {
		err = verifySBOM(layoutDir, index, sbom, img)
	}
	_, mods, _ := modules(img.binaries)
	check(errorf(err, "the SBOM"), "SBOM: it lists the %d modules of the %s binaries, their Go, and the CA bundle", len(mods), strings.Join(platformNames(img.binaries), ", "))

	check(errorf(checkChart(filepath.Join(dir, chartFile(version)), index.Digest), "the chart"), "chart: a default install pulls the image by its digest %s", index.Digest)

	if key == nil {
		say("no key given: the signatures were not checked (release verify --key cosign.pub)")
	}
	return errors.Join(errs...)
}

// errorf adds context to a non-nil error.
func errorf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
}

// unsummed are the files SHA256SUMS does not list: itself, and the two written after it.
func unsummed(path string) bool {
	return path == sumsFile || path == sumsSigFile || path == publicKeyFile
}

// checkSums reads SHA256SUMS as `sha256sum --check --strict` does and also fails on a file it
// does not list. It returns how many files it lists.
func checkSums(dir string, sums []byte) (int, error) {
	var errs []error
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, path, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 || path == "" || !fs.ValidPath(path) {
			errs = append(errs, fmt.Errorf("%s: the line %q is not `<sha256>  <path>`", sumsFile, sc.Text()))
			continue
		}
		listed[path] = true
		got, err := fileSHA256(filepath.Join(dir, filepath.FromSlash(path)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s lists %s: %w", sumsFile, path, err))
			continue
		}
		if got != sum {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, %s says %s", path, got, sumsFile, sum))
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !unsummed(rel) && !listed[rel] {
			errs = append(errs, fmt.Errorf("%s is not in %s", rel, sumsFile))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(listed), errors.Join(errs...)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkBlobs checks that every blob of the layout has the digest it is named by.
func checkBlobs(layoutDir string) error {
	entries, err := os.ReadDir(filepath.Join(layoutDir, "blobs", "sha256"))
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		got, err := fileSHA256(filepath.Join(layoutDir, "blobs", "sha256", e.Name()))
		if err != nil {
			return err
		}
		if got != e.Name() {
			errs = append(errs, fmt.Errorf("the blob sha256:%s has the digest sha256:%s", e.Name(), got))
		}
	}
	return errors.Join(errs...)
}

// imageIndex is the image index of a release's layout: the one index in index.json with a
// name, which is the release's version.
func imageIndex(layoutDir string) (v1.Descriptor, string, error) {
	m, err := indexJSON(layoutDir)
	if err != nil {
		return v1.Descriptor{}, "", err
	}
	var found []v1.Descriptor
	for _, d := range m.Manifests {
		if d.MediaType.IsIndex() && d.Annotations[refAnnotation] != "" {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		return v1.Descriptor{}, "", fmt.Errorf("%s: %d named image indexes in index.json, want one", layoutDir, len(found))
	}
	return found[0], found[0].Annotations[refAnnotation], nil
}

func indexJSON(layoutDir string) (*v1.IndexManifest, error) {
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		return nil, err
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	return outer.IndexManifest()
}

// cosignLayers returns the layers of the signature image index.json lists under cosign's tag,
// each with its content, or nil if there is none.
func cosignLayers(layoutDir string, index v1.Descriptor, suffix string) ([]cosignLayer, error) {
	m, err := indexJSON(layoutDir)
	if err != nil {
		return nil, err
	}
	tag := cosignTag(index.Digest, suffix)
	for _, d := range m.Manifests {
		if d.Annotations[refAnnotation] != tag {
			continue
		}
		raw, err := readBlob(layoutDir, d.Digest)
		if err != nil {
			return nil, err
		}
		sm, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tag, err)
		}
		var out []cosignLayer
		for _, l := range sm.Layers {
			body, err := readBlob(layoutDir, l.Digest)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", tag, err)
			}
			out = append(out, cosignLayer{mediaType: l.MediaType, body: body, annotations: l.Annotations})
		}
		return out, nil
	}
	return nil, nil
}

// verifyImageSignature checks that a simple-signing payload naming the image index is signed
// with the key, as `cosign verify --key` does.
func verifyImageSignature(layoutDir string, index v1.Descriptor, key *ecdsa.PublicKey) error {
	layers, err := cosignLayers(layoutDir, index, "sig")
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range layers {
		if l.mediaType != simpleSigningMediaType {
			continue
		}
		if err := verifyBlob(key, l.body, []byte(l.annotations[signatureAnnotation])); err != nil {
			errs = append(errs, err)
			continue
		}
		var p payload.Cosign
		if err := json.Unmarshal(l.body, &p); err != nil {
			errs = append(errs, fmt.Errorf("the signed payload: %w", err))
			continue
		}
		if p.Image.DigestStr() != index.Digest.String() {
			errs = append(errs, fmt.Errorf("the signed payload names the image %s", p.Image.DigestStr()))
			continue
		}
		return nil
	}
	if len(errs) == 0 {
		return fmt.Errorf("no signature of the image index %s: index.json lists no %s with a payload", index.Digest, cosignTag(index.Digest, "sig"))
	}
	return fmt.Errorf("no signature of the image index %s verifies with the key (%s in index.json): %w", index.Digest, cosignTag(index.Digest, "sig"), errors.Join(errs...))
}

// verifyProvenance checks the provenance statement: it is the one attached to the image index
// in the layout, a valid SLSA provenance whose subjects are the index and the release's files;
// with a key, its DSSE envelope, beside it and in the layout, is signed with the key.
func verifyProvenance(dir, layoutDir, version string, index v1.Descriptor, statement []byte, key *ecdsa.PublicKey) error {
	art, err := findArtifact(layoutDir, index, intotoMediaType)
	if err != nil {
		return err
	}
	if !bytes.Equal(art.body, statement) {
		return fmt.Errorf("%s is not the statement attached to the image index (%s)", provenanceFile(version), art.desc.Digest)
	}
	st, _, err := readProvenance(statement)
	if err != nil {
		return err
	}
	files, err := releaseFiles(dir, version)
	if err != nil {
		return err
	}
	if err := checkSubjects(st, index.Digest, files); err != nil {
		return err
	}
	if key == nil {
		return nil
	}
	env, err := os.ReadFile(filepath.Join(dir, envelopeFile(version)))
	if err != nil {
		return err
	}
	signed, err := openEnvelope(key, env)
	if err != nil {
		return fmt.Errorf("%s: %w", envelopeFile(version), err)
	}
	if !bytes.Equal(signed, statement) {
		return fmt.Errorf("%s signs another statement than %s", envelopeFile(version), provenanceFile(version))
	}
	layers, err := cosignLayers(layoutDir, index, "att")
	if err != nil {
		return err
	}
	for _, l := range layers {
		if l.mediaType == dsseMediaType && l.annotations[predicateTypeAnnotation] == provenanceType && bytes.Equal(l.body, env) {
			return nil
		}
	}
	return fmt.Errorf("the layout has no attestation %s holding %s", cosignTag(index.Digest, "att"), envelopeFile(version))
}

// verifySBOM checks that the SBOM file is the one attached to the image index and lists what
// the image holds.
func verifySBOM(layoutDir string, index v1.Descriptor, sbom []byte, img image) error {
	art, err := findArtifact(layoutDir, index, spdxMediaType)
	if err != nil {
		return err
	}
	if !bytes.Equal(art.body, sbom) {
		return fmt.Errorf("the SBOM file is not the one attached to the image index (%s)", art.desc.Digest)
	}
	return checkSBOM(sbom, img)
}

// checkChart checks that the packaged chart's values pull the image by the index's digest.
func checkChart(path string, index v1.Hash) error {
	tgz, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var values []byte
	if err := walkTgz(tgz, func(name string, body []byte) error {
		if dir, file, ok := strings.Cut(name, "/"); ok && dir != "" && file == "values.yaml" {
			values = body
		}
		return nil
	}); err != nil {
		return err
	}
	if values == nil {
		return errors.New("no values.yaml")
	}
	var v struct {
		Image struct {
			Digest string `json:"digest"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		return err
	}
	if v.Image.Digest != index.String() {
		return fmt.Errorf("values.yaml has image.digest %q, want the image index's %s", v.Image.Digest, index)
	}
	return nil
}
