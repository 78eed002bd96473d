package main

import (
	"bytes"
	"crypto/ecdsa"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/health-router/health-router/deploy/cabundle"
)

// fakeRelease writes a release as `release` does, but for an image of this test's own binary
// (a Go binary with build information) on two platforms and a chart of two files, so that no
// image, helm or compiler is needed; then seals it as release does (provenance, signatures
// with key, SHA256SUMS, verification). It returns the directory and what seal said.
func fakeRelease(t *testing.T, key *ecdsa.PrivateKey) (string, string) {
	t.Helper()
	o := testOptions()
	o.out, o.key = filepath.Join(t.TempDir(), "release"), key
	o.platforms = []platform{{"linux", "amd64"}}
	layoutDir := filepath.Join(o.out, imageDir)
	bin, _ := testBinary(t)
	writeFakeLayout(t, layoutDir, o.version, func(string) []byte { return bin }, cabundle.Pinned())
	img, err := openImage(layoutDir, o.version)
	if err != nil {
		t.Fatal(err)
	}
	sbom, err := spdxDocument(o, img)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(o.out, sbomFile(o.version)), sbom)
	if err := attachArtifact(layoutDir, img.desc, spdxMediaType, sbom, sbomFile(o.version), o.epoch); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(o.out, chartFile(o.version)), fakeChart(t, img.desc.Digest))
	archive, err := tarGz(o.epoch, nil, []archiveFile{{name: "health-router", mode: 0o755, body: []byte("a darwin binary")}})
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(o.out, cliFile(o.version, platform{"darwin", "arm64"})), archive)
	var said bytes.Buffer
	if err := seal(o, img, &said, func(string, ...any) {}); err != nil {
		t.Fatalf("seal: %v\n%s", err, said.String())
	}
	return o.out, said.String()
}

// fakeChart is a packaged chart of the chart's values, pulling the image by digest.
func fakeChart(t *testing.T, digest v1.Hash) []byte {
	t.Helper()
	values, err := os.ReadFile("../charts/health-router/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if values, err = setImageDigest(values, digest); err != nil {
		t.Fatal(err)
	}
	tgz, err := tarGz(testOptions().epoch, nil, []archiveFile{{name: "health-router/Chart.yaml", mode: 0o644, body: []byte("name: health-router\n")}, {name: "health-router/values.yaml", mode: 0o644, body: values}})
	if err != nil {
		t.Fatal(err)
	}
	return tgz
}

func write(t *testing.T, path string, body []byte) {
	t.Helper()
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// resum writes SHA256SUMS and its signature again over a tampered release, as someone who had
// the key would: what still fails is what the check under test catches, not SHA256SUMS.
func resum(t *testing.T, dir string, key *ecdsa.PrivateKey) {
	t.Helper()
	sums, err := checksums(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, sumsFile), sums)
	if key != nil {
		sig, err := signBlob(key, sums)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, sumsSigFile), sig)
	}
}

// editIndexJSON rewrites the layout's index.json.
func editIndexJSON(t *testing.T, dir string, edit func(m *v1.IndexManifest)) {
	t.Helper()
	path := filepath.Join(dir, imageDir, "index.json")
	m, err := v1.ParseIndexManifest(bytes.NewReader(read(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	write(t, path, b)
}

// resign replaces the image index's signature in the layout with one of the given layers.
func resign(t *testing.T, dir string, layers ...cosignLayer) {
	t.Helper()
	layoutDir := filepath.Join(dir, imageDir)
	index, _, err := imageIndex(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	editIndexJSON(t, dir, func(m *v1.IndexManifest) {
		var kept []v1.Descriptor
		for _, d := range m.Manifests {
			if d.Annotations[refAnnotation] != cosignTag(index.Digest, "sig") {
				kept = append(kept, d)
			}
		}
		m.Manifests = kept
	})
	if len(layers) > 0 {
		if err := appendSignatures(layoutDir, index.Digest, "sig", kindSignatures, layers...); err != nil {
			t.Fatal(err)
		}
	}
}

// signedPayload is a simple-signing layer of payload signed with key.
func signedPayload(t *testing.T, key *ecdsa.PrivateKey, payload []byte) cosignLayer {
	t.Helper()
	sig, err := signBlob(key, payload)
	if err != nil {
		t.Fatal(err)
	}
	return cosignLayer{mediaType: simpleSigningMediaType, body: payload, annotations: map[string]string{signatureAnnotation: string(sig)}}
}

// TestVerify writes a signed release and checks that it verifies, then that each way of
// tampering with it fails, each on its own: SHA256SUMS is written and signed again after the
// tampering where the tampering would otherwise fail there first.
func TestVerify(t *testing.T) {
	key, other := newKey(t), newKey(t)
	pristine, said := fakeRelease(t, key)
	if strings.Contains(said, "UNSIGNED") || !strings.Contains(said, "verify: image index sha256:") {
		t.Errorf("a signed release said:\n%s", said)
	}
	for _, f := range []string{sumsSigFile, publicKeyFile, envelopeFile("1.2.3"), provenanceFile("1.2.3")} {
		if _, err := os.Stat(filepath.Join(pristine, f)); err != nil {
			t.Errorf("a signed release: %v", err)
		}
	}
	if pub, err := loadPublicKey(read(t, filepath.Join(pristine, publicKeyFile))); err != nil || !pub.Equal(&key.PublicKey) {
		t.Errorf("%s is not the signing key's public key (%v)", publicKeyFile, err)
	}
	index, _, err := imageIndex(filepath.Join(pristine, imageDir))
	if err != nil {
		t.Fatal(err)
	}
	otherDigest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("cd", 32)}

	for _, tt := range []struct {
		name    string
		tamper  func(t *testing.T, dir string)
		key     *ecdsa.PrivateKey // verify with; nil: the signing key
		wantErr []string
	}{
		{name: "as written", tamper: func(*testing.T, string) {}},
		{name: "another key", tamper: func(*testing.T, string) {}, key: other,
			wantErr: []string{"SHA256SUMS.sig", "no signature of the image index", "DSSE envelope"}},
		{name: "a file changed", tamper: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, cliFile("1.2.3", platform{"darwin", "arm64"})), []byte("another binary"))
		}, wantErr: []string{"health-router_1.2.3_darwin_arm64.tar.gz: sha256", "the provenance does not name health-router_1.2.3_darwin_arm64.tar.gz"}},
		{name: "SHA256SUMS rewritten for a changed file", tamper: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, cliFile("1.2.3", platform{"darwin", "arm64"})), []byte("another binary"))
			resum(t, dir, nil)
		}, wantErr: []string{"SHA256SUMS.sig", "the provenance does not name"}},
		{name: "SHA256SUMS tampered", tamper: func(t *testing.T, dir string) {
			sums := read(t, filepath.Join(dir, sumsFile))
			write(t, filepath.Join(dir, sumsFile), append(sums, []byte(strings.Repeat("0", 64)+"  evil.sh\n")...))
		}, wantErr: []string{"SHA256SUMS.sig", "SHA256SUMS lists evil.sh"}},
		{name: "a file not in SHA256SUMS", tamper: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "evil.sh"), []byte("#!/bin/sh\n"))
		}, wantErr: []string{"evil.sh is not in SHA256SUMS"}},
		{name: "a blob corrupted", tamper: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, imageDir, "blobs", "sha256", emptyConfigHex(t)), []byte("{ }"))
			resum(t, dir, key)
		}, wantErr: []string{"has the digest"}},
		{name: "the signed payload tampered", tamper: func(t *testing.T, dir string) {
			good, err := imagePayload("ghcr.io/health-router/health-router", index.Digest)
			if err != nil {
				t.Fatal(err)
			}
			bad, err := imagePayload("ghcr.io/health-router/health-router", otherDigest)
			if err != nil {
				t.Fatal(err)
			}
			l := signedPayload(t, key, good)
			l.body = bad // the signature of the good payload on another
			resign(t, dir, l)
			resum(t, dir, key)
		}, wantErr: []string{"no signature of the image index", "does not verify"}},
		{name: "a signature of another image", tamper: func(t *testing.T, dir string) {
			bad, err := imagePayload("ghcr.io/health-router/health-router", otherDigest)
			if err != nil {
				t.Fatal(err)
			}
			resign(t, dir, signedPayload(t, key, bad))
			resum(t, dir, key)
		}, wantErr: []string{"names the image sha256:" + otherDigest.Hex}},
		{name: "no signature of the image", tamper: func(t *testing.T, dir string) {
			resign(t, dir)
			resum(t, dir, key)
		}, wantErr: []string{"no signature of the image index"}},
		{name: "the image index replaced", tamper: func(t *testing.T, dir string) {
			// Another index (the same images, another annotation) in the first one's place.
			raw := read(t, filepath.Join(dir, imageDir, "blobs", "sha256", index.Digest.Hex))
			var m map[string]any
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			m["annotations"] = map[string]any{"org.opencontainers.image.version": "9.9.9"}
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			h, size, err := v1.SHA256(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, imageDir, "blobs", "sha256", h.Hex), raw)
			editIndexJSON(t, dir, func(im *v1.IndexManifest) {
				for i, d := range im.Manifests {
					if d.Digest == index.Digest {
						im.Manifests[i].Digest, im.Manifests[i].Size = h, size
					}
				}
			})
			resum(t, dir, key)
		}, wantErr: []string{"no signature of the image index", "the provenance", "the SBOM", "the chart"}},
		{name: "the provenance changed", tamper: func(t *testing.T, dir string) {
			path := filepath.Join(dir, provenanceFile("1.2.3"))
			write(t, path, bytes.Replace(read(t, path), []byte(defaultBuilderID), []byte("https://example.com/elsewhere"), 1))
			resum(t, dir, key)
		}, wantErr: []string{"is not the statement attached to the image index"}},
		{name: "the provenance envelope tampered", tamper: func(t *testing.T, dir string) {
			path := filepath.Join(dir, envelopeFile("1.2.3"))
			var e map[string]any
			if err := json.Unmarshal(read(t, path), &e); err != nil {
				t.Fatal(err)
			}
			e["payloadType"] = "application/json"
			b, _ := json.Marshal(e)
			write(t, path, b)
			resum(t, dir, key)
		}, wantErr: []string{"application/json"}},
		{name: "the SBOM changed", tamper: func(t *testing.T, dir string) {
			path := filepath.Join(dir, sbomFile("1.2.3"))
			write(t, path, bytes.Replace(read(t, path), []byte(`"stdlib"`), []byte(`"libc"`), 1))
			resum(t, dir, key)
		}, wantErr: []string{"the SBOM file is not the one attached"}},
		{name: "the chart pulls another image", tamper: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, chartFile("1.2.3")), fakeChart(t, otherDigest))
			resum(t, dir, key)
		}, wantErr: []string{"image.digest \"sha256:" + otherDigest.Hex + "\""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "release")
			if err := os.CopyFS(dir, os.DirFS(pristine)); err != nil {
				t.Fatal(err)
			}
			tt.tamper(t, dir)
			k := key
			if tt.key != nil {
				k = tt.key
			}
			var out bytes.Buffer
			err := verifyRelease(dir, &k.PublicKey, &out)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("%v\n%s", err, out.String())
				}
				for _, want := range []string{"SHA256SUMS.sig: the key signed", "image index sha256:", "provenance: its subjects", "SBOM: it lists", "chart: a default install pulls"} {
					if !strings.Contains(out.String(), want) {
						t.Errorf("verify said nothing of %q:\n%s", want, out.String())
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("verified:\n%s", out.String())
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q:\n%v", want, err)
				}
			}
		})
	}
}

func emptyConfigHex(t *testing.T) string {
	t.Helper()
	h, _, err := v1.SHA256(bytes.NewReader(emptyConfig))
	if err != nil {
		t.Fatal(err)
	}
	return h.Hex
}

// TestUnsigned: without a key the release says it is unsigned, writes no signature, and still
// verifies all else; given a key, verify fails on it.
func TestUnsigned(t *testing.T) {
	dir, said := fakeRelease(t, nil)
	if n := strings.Count(said, "UNSIGNED"); n != 1 {
		t.Errorf("an unsigned release said UNSIGNED %d times, want once:\n%s", n, said)
	}
	for _, f := range []string{sumsSigFile, publicKeyFile, envelopeFile("1.2.3")} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("an unsigned release has %s (%v)", f, err)
		}
	}
	m, err := indexJSON(filepath.Join(dir, imageDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		if k := d.Annotations[kindAnnotation]; k == kindSignatures || k == kindAttestations {
			t.Errorf("an unsigned layout lists %s", k)
		}
	}
	var out bytes.Buffer
	if err := verifyRelease(dir, nil, &out); err != nil || !strings.Contains(out.String(), "signatures were not checked") {
		t.Errorf("verify without a key: %v\n%s", err, out.String())
	}
	if err := verifyRelease(dir, &newKey(t).PublicKey, &out); err == nil || !strings.Contains(err.Error(), sumsSigFile) {
		t.Errorf("verify of an unsigned release with a key: %v, want it to fail on %s", err, sumsSigFile)
	}
}

// TestReproducibleSigned: one key and one commit give the same release, signatures included.
func TestReproducibleSigned(t *testing.T) {
	key := newKey(t)
	a, _ := fakeRelease(t, key)
	b, _ := fakeRelease(t, key)
	for _, f := range []string{sumsFile, sumsSigFile, envelopeFile("1.2.3"), filepath.Join(imageDir, "index.json")} {
		if !bytes.Equal(read(t, filepath.Join(a, f)), read(t, filepath.Join(b, f))) {
			t.Errorf("two releases of one commit with one key: %s differs", f)
		}
	}
}

// TestLayoutForCosign checks the layout as cosign reads it (`cosign verify --local-image`,
// `cosign verify-attestation --local-image`): the index marked as the signed entity, the
// signature and the attestation by kind and tag, with cosign's media types and annotations.
func TestLayoutForCosign(t *testing.T) {
	dir, _ := fakeRelease(t, newKey(t))
	layoutDir := filepath.Join(dir, imageDir)
	m, err := indexJSON(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	index, _, err := imageIndex(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]v1.Descriptor{}
	for _, d := range m.Manifests {
		if k := d.Annotations[kindAnnotation]; k != "" {
			kinds[k] = d
		}
	}
	if d := kinds[kindImageIndex]; d.Digest != index.Digest {
		t.Errorf("the entry of kind %s is %s, want the image index %s", kindImageIndex, d.Digest, index.Digest)
	}
	for kind, want := range map[string]struct {
		tag       string
		mediaType types.MediaType
	}{
		kindSignatures:   {cosignTag(index.Digest, "sig"), simpleSigningMediaType},
		kindAttestations: {cosignTag(index.Digest, "att"), dsseMediaType},
	} {
		d, ok := kinds[kind]
		if !ok || d.Annotations[refAnnotation] != want.tag || d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("kind %s: %+v, want an OCI manifest tagged %s", kind, d, want.tag)
			continue
		}
		sm, err := v1.ParseManifest(bytes.NewReader(read(t, filepath.Join(layoutDir, "blobs", "sha256", d.Digest.Hex))))
		if err != nil {
			t.Fatal(err)
		}
		if len(sm.Layers) != 1 || sm.Layers[0].MediaType != want.mediaType {
			t.Errorf("%s: layers %+v, want one of %s", want.tag, sm.Layers, want.mediaType)
			continue
		}
		if _, ok := sm.Layers[0].Annotations[signatureAnnotation]; !ok {
			t.Errorf("%s: no %s annotation", want.tag, signatureAnnotation)
		}
		if kind == kindAttestations && sm.Layers[0].Annotations[predicateTypeAnnotation] != provenanceType {
			t.Errorf("%s: annotations %v, want predicateType %s", want.tag, sm.Layers[0].Annotations, provenanceType)
		}
	}
	// The provenance is also an OCI 1.1 artifact of the index, as the SBOM is.
	art, err := findArtifact(layoutDir, index, intotoMediaType)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(art.body, read(t, filepath.Join(dir, provenanceFile("1.2.3")))) {
		t.Error("the provenance artifact is not the statement beside it")
	}
}
