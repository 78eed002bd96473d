package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where deploy/image puts things: the binary in the image, the name of the index in the layout.
const (
	binaryInImage = "usr/local/bin/health-router"
	refAnnotation = "org.opencontainers.image.ref.name"
)

// The SBOM as an OCI artifact: its type, as `oras attach --artifact-type` and cosign's
// attestations name an SPDX document, and the empty config OCI 1.1 gives an artifact.
const (
	spdxMediaType   = "application/spdx+json"
	titleAnnotation = "org.opencontainers.image.title"
	createdAnnot    = "org.opencontainers.image.created"
)

// emptyConfig is the OCI 1.1 empty descriptor's content.
var emptyConfig = []byte("{}")

// image is deploy/image's index in a layout and the binary of each of its platforms.
type image struct {
	desc     v1.Descriptor
	binaries map[platform][]byte
}

// openImage finds the index named version in the OCI layout at dir and takes each platform's
// binary out of its image.
func openImage(dir, version string) (image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return image{}, err
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return image{}, err
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return image{}, err
	}
	for _, desc := range m.Manifests {
		if !desc.MediaType.IsIndex() || desc.Annotations[refAnnotation] != version {
			continue
		}
		idx, err := outer.ImageIndex(desc.Digest)
		if err != nil {
			return image{}, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return image{}, err
		}
		img := image{desc: v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest}, binaries: map[platform][]byte{}}
		for _, d := range im.Manifests {
			if d.Platform == nil {
				return image{}, fmt.Errorf("%s: manifest %s has no platform", dir, d.Digest)
			}
			one, err := idx.Image(d.Digest)
			if err != nil {
				return image{}, err
			}
			bin, err := fileInImage(one, binaryInImage)
			if err != nil {
				return image{}, fmt.Errorf("%s %s: %w", dir, d.Platform, err)
			}
			img.binaries[platform{d.Platform.OS, d.Platform.Architecture}] = bin
		}
		return img, nil
	}
	return image{}, fmt.Errorf("%s: no image index named %q", dir, version)
}

// fileInImage returns the content of the regular file at name in the image's layers (the
// last layer that has it: deploy/image's images have one layer and no whiteouts).
func fileInImage(img v1.Image, name string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	var found []byte
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			if h.Name == name && h.Typeflag == tar.TypeReg {
				if found, err = io.ReadAll(tr); err != nil {
					rc.Close()
					return nil, err
				}
			}
		}
		rc.Close()
	}
	if found == nil {
		return nil, fmt.Errorf("no file %s in the image", name)
	}
	return found, nil
}

// sbomManifest is the SBOM's artifact manifest: an OCI image manifest with an artifactType,
// the empty config, the document as its one layer, and the image index as its subject, as
// `oras attach` writes one. Tools find it through the subject (`oras discover`, a registry's
// referrers API).
func sbomManifest(subject v1.Descriptor, sbom []byte, title string, created time.Time) ([]byte, error) {
	sbomDigest, sbomSize, err := v1.SHA256(bytes.NewReader(sbom))
	if err != nil {
		return nil, err
	}
	cfgDigest, cfgSize, err := v1.SHA256(bytes.NewReader(emptyConfig))
	if err != nil {
		return nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  spdxMediaType,
		Config:        v1.Descriptor{MediaType: types.OCIEmptyJSON, Size: cfgSize, Digest: cfgDigest, Data: emptyConfig},
		Layers: []v1.Descriptor{{
			MediaType:   spdxMediaType,
			Size:        sbomSize,
			Digest:      sbomDigest,
			Annotations: map[string]string{titleAnnotation: title},
		}},
		Subject:     &subject,
		Annotations: map[string]string{createdAnnot: created.UTC().Format(time.RFC3339)},
	}
	return json.Marshal(m)
}

// attachSBOM writes the SBOM and its artifact manifest into the layout and lists the manifest
// in index.json beside the image index (without a name: it is found by its subject).
func attachSBOM(dir string, subject v1.Descriptor, sbom []byte, title string, created time.Time) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	manifest, err := sbomManifest(subject, sbom, title, created)
	if err != nil {
		return err
	}
	for _, blob := range [][]byte{emptyConfig, sbom, manifest} {
		h, _, err := v1.SHA256(bytes.NewReader(blob))
		if err != nil {
			return err
		}
		if err := p.WriteBlob(h, io.NopCloser(bytes.NewReader(blob))); err != nil {
			return err
		}
	}
	h, size, err := v1.SHA256(bytes.NewReader(manifest))
	if err != nil {
		return err
	}
	return p.AppendDescriptor(v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: size, Digest: h, ArtifactType: spdxMediaType})
}
