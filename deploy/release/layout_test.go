package main

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/health-router/health-router/deploy/cabundle"
)

// fakeImage is an image as deploy/image lays one out: one layer holding the binary and the CA
// bundle.
func fakeImage(t *testing.T, binary, ca []byte) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		body []byte
	}{{"etc/passwd", []byte("root:x:0:0")}, {caInImage, ca}, {binaryInImage, binary}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o755, Size: int64(len(f.body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// fakeLayout writes an OCI layout with an index named version over two platforms' images.
func fakeLayout(t *testing.T, version string) (string, v1.Hash) {
	t.Helper()
	dir := t.TempDir()
	return dir, writeFakeLayout(t, dir, version, func(arch string) []byte { return []byte("binary-" + arch) }, []byte("ca-bundle"))
}

// writeFakeLayout writes into dir an OCI layout with an index named version over images for
// linux/amd64 and linux/arm64, each with the binary binary(arch) and the CA bundle ca.
func writeFakeLayout(t *testing.T, dir, version string, binary func(arch string) []byte, ca []byte) v1.Hash {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: fakeImage(t, binary(arch), ca), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refAnnotation: version})); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOpenImage(t *testing.T) {
	dir, digest := fakeLayout(t, "1.2.3")
	img, err := openImage(dir, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if img.desc.Digest != digest || img.desc.MediaType != types.OCIImageIndex || img.desc.Size == 0 {
		t.Errorf("descriptor %+v, want the index %s", img.desc, digest)
	}
	if len(img.binaries) != 2 || string(img.binaries[platform{"linux", "amd64"}]) != "binary-amd64" || string(img.binaries[platform{"linux", "arm64"}]) != "binary-arm64" {
		t.Errorf("binaries %q, want each platform's own", img.binaries)
	}
	if len(img.caBundles) != 2 || string(img.caBundles[platform{"linux", "amd64"}]) != "ca-bundle" {
		t.Errorf("CA bundles %q, want each platform's", img.caBundles)
	}
	if "/"+caInImage != cabundle.Path {
		t.Errorf("the release reads the CA bundle at /%s, deploy/image writes it at %s", caInImage, cabundle.Path)
	}
	if _, err := openImage(dir, "9.9.9"); err == nil {
		t.Error("openImage of a version the layout does not name: want an error")
	}
}

func TestAttachArtifact(t *testing.T) {
	dir, digest := fakeLayout(t, "1.2.3")
	img, err := openImage(dir, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	sbom := []byte(`{"spdxVersion":"SPDX-2.3"}`)
	created := time.Unix(1763726400, 0)
	if err := attachArtifact(dir, img.desc, spdxMediaType, sbom, "hr_sbom.spdx.json", created); err != nil {
		t.Fatal(err)
	}
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
	if len(m.Manifests) != 2 || m.Manifests[0].Digest != digest {
		t.Fatalf("index.json %+v: want the image index, then the SBOM", m.Manifests)
	}
	desc := m.Manifests[1]
	if desc.ArtifactType != string(spdxMediaType) || desc.MediaType != types.OCIManifestSchema1 || desc.Annotations[refAnnotation] != "" {
		t.Errorf("the SBOM's entry %+v: want an unnamed OCI manifest of artifactType %s", desc, spdxMediaType)
	}
	art, err := outer.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	am, err := art.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if am.Subject == nil || am.Subject.Digest != digest || am.Subject.MediaType != types.OCIImageIndex || am.Subject.Size != img.desc.Size {
		t.Errorf("subject %+v, want the image index %s", am.Subject, digest)
	}
	if am.ArtifactType != string(spdxMediaType) || am.Config.MediaType != types.OCIEmptyJSON || am.Config.Size != 2 {
		t.Errorf("artifactType %q config %+v: want an artifact with the empty config", am.ArtifactType, am.Config)
	}
	if am.Annotations[createdAnnot] != "2025-11-21T12:00:00Z" {
		t.Errorf("annotations %v, want created at SOURCE_DATE_EPOCH", am.Annotations)
	}
	// The config and the document are blobs of the layout, where their descriptors say.
	if cfg, err := art.RawConfigFile(); err != nil || string(cfg) != "{}" {
		t.Errorf("config blob %q, %v", cfg, err)
	}
	layers, err := art.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, sbom) || am.Layers[0].MediaType != spdxMediaType || am.Layers[0].Annotations[titleAnnotation] != "hr_sbom.spdx.json" {
		t.Errorf("layer %+v holds %q, want the SBOM", am.Layers[0], got)
	}
	found, err := findArtifact(dir, img.desc, spdxMediaType)
	if err != nil || !bytes.Equal(found.body, sbom) || found.desc.Digest != desc.Digest {
		t.Errorf("findArtifact: %+v, %v; want the SBOM", found.desc, err)
	}
	if _, err := findArtifact(dir, img.desc, intotoMediaType); err == nil {
		t.Error("findArtifact of a type not attached: want an error")
	}
}
