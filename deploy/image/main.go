// Command image builds the health-router container image without a Docker daemon and without a
// base image: a static binary (CGO off) per platform, a CA bundle pinned by go.mod, a passwd entry for
// the non-root user 65532, nothing else (no shell). The result is a multi-platform OCI image
// index written as an OCI layout directory, or pushed to a registry.
//
//	go run ./deploy/image build --out bin/image --version v0.1.0 --revision $(git rev-parse HEAD)
//	go run ./deploy/image push --layout bin/image --ref 123456789012.dkr.ecr.eu-west-1.amazonaws.com/health-router:v0.1.0
//
// The image is reproducible: every timestamp is SOURCE_DATE_EPOCH (the commit time, from the
// Makefile), files are written in a fixed order with fixed owners and modes, and the binary is
// built with -trimpath, and the CA bundle is Mozilla's roots as the module
// golang.org/x/crypto/x509roots/fallback holds them at the version go.mod pins, not the build
// machine's (which differs with its ca-certificates), so one commit gives one digest on any
// builder.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/health-router/health-router/deploy/cabundle"
	"github.com/health-router/health-router/deploy/gobuild"
	"github.com/health-router/health-router/router/version"
)

// Where things are in the image.
const (
	binaryPath = "/usr/local/bin/health-router"
	caPath     = cabundle.Path
	uid        = 65532
)

// refAnnotation names the image in the layout's index.json, as crane and skopeo read it.
const refAnnotation = "org.opencontainers.image.ref.name"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: image build|push [flags]")
	}
	switch args[0] {
	case "build":
		return build(args[1:])
	case "push":
		return push(args[1:])
	}
	return fmt.Errorf("unknown command %q: want build or push", args[0])
}

// buildOptions are the flags of `image build`.
type buildOptions struct {
	out       string
	pkg       string
	platforms []v1.Platform
	caBundle  string
	version   string
	revision  string
	source    string
	epoch     time.Time
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	var o buildOptions
	fs.StringVar(&o.out, "out", "bin/image", "OCI layout directory to write (replaced)")
	fs.StringVar(&o.pkg, "package", "./cmd/health-router", "the main package to build")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated os/arch list")
	fs.StringVar(&o.caBundle, "ca-bundle", "", "CA bundle file to put in the image instead of the one pinned by go.mod (golang.org/x/crypto/x509roots/fallback); the digest then depends on that file")
	fs.StringVar(&o.version, "version", "dev", "org.opencontainers.image.version, and what the binary's version command says")
	fs.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision: the commit (required), and the binary's")
	fs.StringVar(&o.source, "source", "https://github.com/health-router/health-router", "org.opencontainers.image.source")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.revision == "" {
		return errors.New("--revision is required (the commit the image is built from)")
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		return errors.New("SOURCE_DATE_EPOCH is not set: the image's timestamps would not be reproducible (the Makefile sets it to the commit time)")
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", epoch)
	}
	o.epoch = time.Unix(secs, 0).UTC()
	for _, p := range strings.Split(*platforms, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || osName != "linux" || arch == "" {
			return fmt.Errorf("--platforms: %q is not linux/<arch>", p)
		}
		o.platforms = append(o.platforms, v1.Platform{OS: osName, Architecture: arch})
	}
	ca := cabundle.Pinned()
	if o.caBundle != "" {
		if ca, err = os.ReadFile(o.caBundle); err != nil {
			return fmt.Errorf("reading --ca-bundle: %w", err)
		}
	}
	idx, err := index(o, ca)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(o.out); err != nil {
		return err
	}
	p, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refAnnotation: o.version})); err != nil {
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Println(d)
	return nil
}

// labels are the OCI annotations the image config and the index carry.
func labels(o buildOptions) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.title":    "health-router",
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// index builds one image per platform and the index over them.
func index(o buildOptions, ca []byte) (v1.ImageIndex, error) {
	work, err := os.MkdirTemp("", "health-router-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.Annotations(idx, labels(o)).(v1.ImageIndex)
	for _, p := range o.platforms {
		bin := filepath.Join(work, "health-router-"+p.Architecture)
		if err := gobuild.Build(o.pkg, p.OS, p.Architecture, bin, version.LDFlags(o.version, o.revision)); err != nil {
			return nil, err
		}
		img, err := image(o, p, bin, ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		plat := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	return idx, nil
}

// image is one platform's image: one layer on an empty base.
func image(o buildOptions, p v1.Platform, bin string, ca []byte) (v1.Image, error) {
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(o.epoch, binary, ca)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: o.epoch}, CreatedBy: "deploy/image: health-router, CA bundle, passwd", Comment: "health-router " + o.version},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	cfg.Created = v1.Time{Time: o.epoch}
	cfg.Author = "health-router"
	cfg.Config.User = fmt.Sprintf("%d:%d", uid, uid)
	cfg.Config.Entrypoint = []string{binaryPath}
	cfg.Config.Cmd = nil
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{
		"PATH=/usr/local/bin",
		"SSL_CERT_FILE=" + caPath,
	}
	cfg.Config.Labels = labels(o)
	return mutate.ConfigFile(img, cfg)
}

// rootfs is the image's only layer, as a tar: directories, /etc/passwd and /etc/group with the
// non-root user, the CA bundle and the binary. Every entry has the same owner (root, but for
// /tmp) and the epoch as its time, in a fixed order.
func rootfs(epoch time.Time, binary, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)
	steps := []func() error{
		func() error { return dir("etc", 0o755) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("etc/ssl", 0o755) },
		func() error { return dir("etc/ssl/certs", 0o755) },
		func() error { return file(strings.TrimPrefix(caPath, "/"), 0o644, ca) },
		func() error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "home/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
		},
		func() error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/", Mode: 0o700, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX})
		},
		func() error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX})
		},
		func() error { return dir("usr", 0o755) },
		func() error { return dir("usr/local", 0o755) },
		func() error { return dir("usr/local/bin", 0o755) },
		func() error { return file(strings.TrimPrefix(binaryPath, "/"), 0o755, binary) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// push copies the index in an OCI layout to a registry, with the credentials of the Docker
// config (docker login, or a credential helper such as ECR's).
func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	dir := fs.String("layout", "bin/image", "OCI layout directory that `image build` wrote")
	ref := fs.String("ref", "", "where to push: REGISTRY/health-router:TAG (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" {
		return errors.New("--ref is required")
	}
	tag, err := name.ParseReference(*ref)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", *ref, err)
	}
	l, err := load(*dir)
	if err != nil {
		return err
	}
	auth := remote.WithAuthFromKeychain(authn.DefaultKeychain)
	if err := remote.WriteIndex(tag, l.index, auth); err != nil {
		return fmt.Errorf("pushing to %s: %w", tag, err)
	}
	d, err := l.index.Digest()
	if err != nil {
		return err
	}
	// The referrers (the release's SBOM and provenance) go by digest after the index they name:
	// a registry with the OCI referrers API links them itself, for one without it
	// go-containerregistry keeps the referrers index under the tag sha256-<digest>, as cosign
	// and oras do.
	for _, r := range l.referrers {
		rd, err := r.Digest()
		if err != nil {
			return err
		}
		if err := remote.Write(tag.Context().Digest(rd.String()), r, auth); err != nil {
			return fmt.Errorf("pushing %s's referrer %s: %w", d, rd, err)
		}
	}
	// cosign's signature and attestation go under the tags cosign looks them up by.
	for _, t := range slices.Sorted(maps.Keys(l.cosign)) {
		if err := remote.Write(tag.Context().Tag(t), l.cosign[t], auth); err != nil {
			return fmt.Errorf("pushing %s's %s: %w", d, t, err)
		}
	}
	fmt.Printf("%s@%s\n", tag.Context(), d)
	return nil
}

// loaded is what a layout of `image build` (and `make release`) holds: the image index, the
// artifacts that refer to it, and cosign's signature and attestation of it by their tags.
type loaded struct {
	index     v1.ImageIndex
	referrers []v1.Image
	cosign    map[string]v1.Image
}

// load returns the image index `image build` wrote into an OCI layout directory, the artifacts
// in the layout that refer to it (their subject is the index: the SBOM and provenance
// `make release` attaches), and cosign's signature and attestation of it (named in index.json
// with cosign's tags, sha256-<digest>.sig and .att: `make release SIGNING_KEY=...`).
func load(dir string) (loaded, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return loaded{}, fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return loaded{}, fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return loaded{}, err
	}
	var indexes, others []v1.Descriptor
	for _, desc := range m.Manifests {
		if desc.MediaType.IsIndex() {
			indexes = append(indexes, desc)
		} else {
			others = append(others, desc)
		}
	}
	if len(indexes) != 1 {
		return loaded{}, fmt.Errorf("OCI layout %s: want one image index, found %d", dir, len(indexes))
	}
	l := loaded{cosign: map[string]v1.Image{}}
	if l.index, err = outer.ImageIndex(indexes[0].Digest); err != nil {
		return loaded{}, err
	}
	d := indexes[0].Digest
	for _, desc := range others {
		img, err := outer.Image(desc.Digest)
		if err != nil {
			return loaded{}, err
		}
		if t := desc.Annotations[refAnnotation]; t == d.Algorithm+"-"+d.Hex+".sig" || t == d.Algorithm+"-"+d.Hex+".att" {
			l.cosign[t] = img
			continue
		}
		im, err := img.Manifest()
		if err != nil {
			return loaded{}, err
		}
		if im.Subject == nil || im.Subject.Digest != d {
			return loaded{}, fmt.Errorf("OCI layout %s: %s is neither the image index, an artifact referring to it, nor cosign's signature of it", dir, desc.Digest)
		}
		l.referrers = append(l.referrers, img)
	}
	return l, nil
}
