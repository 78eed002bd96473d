package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where deploy/image puts things: the binary and the CA bundle in the image, the name of the
// index in the layout.
const (
	binaryInImage = "usr/local/bin/health-router"
	caInImage     = "etc/ssl/certs/ca-certificates.crt"
	refAnnotation = "org.opencontainers.image.ref.name"
)

// The SBOM and the provenance as OCI artifacts: their types, as `oras attach --artifact-type`
// and cosign's attestations name an SPDX document and an in-toto statement, and the empty
// config OCI 1.1 gives an artifact.
const (
	spdxMediaType   types.MediaType = "application/spdx+json"
	intotoMediaType types.MediaType = "application/vnd.in-toto+json"
	titleAnnotation                 = "org.opencontainers.image.title"
	createdAnnot                    = "org.opencontainers.image.created"
)

// emptyConfig is the OCI 1.1 empty descriptor's content.
var emptyConfig = []byte("{}")

// image is deploy/image's index in a layout and, for each of its platforms, the binary and the
// CA bundle of its image.
type image struct {
	desc      v1.Descriptor
	binaries  map[platform][]byte
	caBundles map[platform][]byte
}

// openImage finds the index named version in the OCI layout at dir and takes each platform's
// binary and CA bundle out of its image.
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
		img := image{desc: v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest}, binaries: map[platform][]byte{}, caBundles: map[platform][]byte{}}
		for _, d := range im.Manifests {
			if d.Platform == nil {
				return image{}, fmt.Errorf("%s: manifest %s has no platform", dir, d.Digest)
			}
			one, err := idx.Image(d.Digest)
			if err != nil {
				return image{}, err
			}
			files, err := filesInImage(one, binaryInImage, caInImage)
			if err != nil {
				return image{}, fmt.Errorf("%s %s: %w", dir, d.Platform, err)
			}
			p := platform{d.Platform.OS, d.Platform.Architecture}
			img.binaries[p], img.caBundles[p] = files[binaryInImage], files[caInImage]
		}
		return img, nil
	}
	return image{}, fmt.Errorf("%s: no image index named %q", dir, version)
}

// filesInImage returns the content of the regular files at names in the image's layers (the
// last layer that has one: deploy/image's images have one layer and no whiteouts).
func filesInImage(img v1.Image, names ...string) (map[string][]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	found := map[string][]byte{}
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
			if h.Typeflag == tar.TypeReg && slices.Contains(names, h.Name) {
				if found[h.Name], err = io.ReadAll(tr); err != nil {
					rc.Close()
					return nil, err
				}
			}
		}
		rc.Close()
	}
	for _, n := range names {
		if found[n] == nil {
			return nil, fmt.Errorf("no file %s in the image", n)
		}
	}
	return found, nil
}

// artifactManifest is an artifact's manifest (the SBOM's, the provenance's): an OCI image
// manifest with an artifactType, the empty config, the document as its one layer, and the
// image index as its subject, as `oras attach` writes one. Tools find it through the subject
// (`oras discover`, a registry's referrers API).
func artifactManifest(subject v1.Descriptor, artifactType types.MediaType, body []byte, title string, created time.Time) ([]byte, error) {
	bodyDigest, bodySize, err := v1.SHA256(bytes.NewReader(body))
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
		ArtifactType:  string(artifactType),
		Config:        v1.Descriptor{MediaType: types.OCIEmptyJSON, Size: cfgSize, Digest: cfgDigest, Data: emptyConfig},
		Layers: []v1.Descriptor{{
			MediaType:   artifactType,
			Size:        bodySize,
			Digest:      bodyDigest,
			Annotations: map[string]string{titleAnnotation: title},
		}},
		Subject:     &subject,
		Annotations: map[string]string{createdAnnot: created.UTC().Format(time.RFC3339)},
	}
	return json.Marshal(m)
}

// attachArtifact writes a document and its artifact manifest into the layout and lists the
// manifest in index.json beside the image index (without a name: it is found by its subject).
func attachArtifact(dir string, subject v1.Descriptor, artifactType types.MediaType, body []byte, title string, created time.Time) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	manifest, err := artifactManifest(subject, artifactType, body, title, created)
	if err != nil {
		return err
	}
	for _, blob := range [][]byte{emptyConfig, body, manifest} {
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
	return p.AppendDescriptor(v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: size, Digest: h, ArtifactType: string(artifactType)})
}

// artifact is an artifact attached to the image index, as read back: its entry in index.json,
// its manifest and its one layer's content.
type artifact struct {
	desc     v1.Descriptor
	manifest *v1.Manifest
	body     []byte
}

// findArtifact returns the one artifact of artifactType in the layout at dir whose subject is
// the image index.
func findArtifact(dir string, index v1.Descriptor, artifactType types.MediaType) (artifact, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return artifact{}, err
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return artifact{}, err
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return artifact{}, err
	}
	var found []artifact
	for _, d := range m.Manifests {
		if d.ArtifactType != string(artifactType) {
			continue
		}
		img, err := outer.Image(d.Digest)
		if err != nil {
			return artifact{}, err
		}
		am, err := img.Manifest()
		if err != nil {
			return artifact{}, err
		}
		if am.Subject == nil || am.Subject.Digest != index.Digest || len(am.Layers) != 1 || am.Layers[0].MediaType != artifactType {
			return artifact{}, fmt.Errorf("the %s artifact %s: want one layer of that type and the image index %s as its subject", artifactType, d.Digest, index.Digest)
		}
		body, err := readBlob(dir, am.Layers[0].Digest)
		if err != nil {
			return artifact{}, err
		}
		found = append(found, artifact{desc: d, manifest: am, body: body})
	}
	if len(found) != 1 {
		return artifact{}, fmt.Errorf("%d artifacts of type %s in index.json, want one", len(found), artifactType)
	}
	return found[0], nil
}

// readBlob reads a blob of the layout at dir and checks that its content has its digest.
func readBlob(dir string, h v1.Hash) ([]byte, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return nil, fmt.Errorf("blob %s: want a sha256 digest", h)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", h.Algorithm, h.Hex))
	if err != nil {
		return nil, err
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != h.Hex {
		return nil, fmt.Errorf("blob %s has the digest sha256:%x", h, got)
	}
	return b, nil
}
