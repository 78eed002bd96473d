package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// A release signed with a key (--signing-key, make release SIGNING_KEY=...) is signed as cosign
// signs with a key, so that cosign verifies it offline (`cosign verify --key cosign.pub
// --insecure-ignore-tlog`) and so does `release verify`:
//
//   - the image index: cosign's simple-signing payload naming its digest, signed, in the layout
//     as cosign lays a signature out (`cosign save`): an image whose layer is the payload, with
//     the base64 signature as the layer's annotation, tagged sha256-<hex>.sig;
//   - the provenance: a DSSE envelope of the statement (an in-toto attestation, as `cosign
//     attest` makes), beside the statement and in the layout tagged sha256-<hex>.att;
//   - SHA256SUMS: SHA256SUMS.sig, the base64 signature of its SHA-256, as `cosign sign-blob
//     --key` writes it.
//
// The key is ECDSA P-256 and each signature is of a SHA-256 digest, ASN.1 DER, as cosign's. The
// signatures are deterministic (RFC 6979): one key and one commit give the same bytes, so the
// release stays reproducible.

// File names of a signed release. The public key is written beside the files for the
// record; a user verifies with the key from a channel they trust, not with this copy.
const (
	sumsSigFile   = "SHA256SUMS.sig"
	publicKeyFile = "cosign.pub"
)

// cosign's names in a layout and in a registry.
const (
	simpleSigningMediaType  types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	dsseMediaType           types.MediaType = "application/vnd.dsse.envelope.v1+json"
	signatureAnnotation                     = "dev.cosignproject.cosign/signature"
	predicateTypeAnnotation                 = "predicateType"
	// kindAnnotation marks the entries of index.json `cosign verify --local-image` reads.
	kindAnnotation   = "kind"
	kindImageIndex   = "dev.cosignproject.cosign/imageIndex"
	kindSignatures   = "dev.cosignproject.cosign/sigs"
	kindAttestations = "dev.cosignproject.cosign/atts"
)

// cosignTag is the tag under which cosign keeps a digest's signatures (sig) or attestations
// (att): sha256-<hex>.sig.
func cosignTag(d v1.Hash, suffix string) string { return d.Algorithm + "-" + d.Hex + "." + suffix }

// Encrypted private keys as `cosign generate-key-pair` writes them: the PKCS #8 key encrypted
// with the password (scrypt and NaCl secretbox, go-securesystemslib's encrypted package).
const (
	cosignKeyType   = "ENCRYPTED COSIGN PRIVATE KEY"
	sigstoreKeyType = "ENCRYPTED SIGSTORE PRIVATE KEY"
)

// loadSigningKey reads a PEM ECDSA P-256 private key: PKCS #8 ("PRIVATE KEY"), SEC 1 ("EC
// PRIVATE KEY"), or cosign's encrypted key, decrypted with password (nil: none was given).
func loadSigningKey(pemBytes, password []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("no PEM block: want a PEM ECDSA P-256 private key (PKCS #8, EC, or cosign's encrypted key)")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case cosignKeyType, sigstoreKeyType:
		if password == nil {
			return nil, errors.New("the key is encrypted (cosign generate-key-pair): set COSIGN_PASSWORD to its password")
		}
		der, derr := encrypted.Decrypt(block.Bytes, password)
		if derr != nil {
			return nil, fmt.Errorf("decrypting the key (is COSIGN_PASSWORD its password?): %w", derr)
		}
		key, err = x509.ParsePKCS8PrivateKey(der)
	default:
		return nil, fmt.Errorf("a PEM %q: want an ECDSA P-256 private key (PRIVATE KEY, EC PRIVATE KEY, or cosign's %s)", block.Type, sigstoreKeyType)
	}
	if err != nil {
		return nil, err
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("a %T: want an ECDSA P-256 key, as cosign's", key)
	}
	return ec, nil
}

// loadPublicKey reads a PEM ECDSA P-256 public key (PKIX, "PUBLIC KEY"), as cosign.pub is.
func loadPublicKey(pemBytes []byte) (*ecdsa.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY (cosign.pub)")
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	ec, ok := key.(*ecdsa.PublicKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("a %T: want an ECDSA P-256 key, as cosign's", key)
	}
	return ec, nil
}

// publicKeyPEM is the key as cosign.pub holds it.
func publicKeyPEM(key *ecdsa.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// signer signs as cosign does with a key, and as DSSE's Signer: ECDSA over the SHA-256 of the
// message, ASN.1 DER, deterministically (a nil random source: RFC 6979). Its key ID is empty,
// as in the envelopes cosign writes.
type signer struct{ key *ecdsa.PrivateKey }

func (s signer) Sign(_ context.Context, msg []byte) ([]byte, error) {
	h := sha256.Sum256(msg)
	return s.key.Sign(nil, h[:], crypto.SHA256)
}

func (s signer) KeyID() (string, error) { return "", nil }

// verifier checks what signer signed.
type verifier struct{ key *ecdsa.PublicKey }

func (v verifier) Verify(_ context.Context, msg, sig []byte) error {
	h := sha256.Sum256(msg)
	if !ecdsa.VerifyASN1(v.key, h[:], sig) {
		return errors.New("the signature does not verify with the key")
	}
	return nil
}

func (v verifier) KeyID() (string, error)   { return "", nil }
func (v verifier) Public() crypto.PublicKey { return v.key }

// signBlob is the signature of a file as `cosign sign-blob --key` writes it: base64, no newline.
func signBlob(key *ecdsa.PrivateKey, blob []byte) ([]byte, error) {
	sig, err := signer{key}.Sign(context.Background(), blob)
	if err != nil {
		return nil, err
	}
	return []byte(base64.StdEncoding.EncodeToString(sig)), nil
}

// verifyBlob checks a signature signBlob wrote (surrounding white space allowed, as cosign does).
func verifyBlob(key *ecdsa.PublicKey, blob, b64sig []byte) error {
	sig, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b64sig)))
	if err != nil {
		return fmt.Errorf("the signature is not base64: %w", err)
	}
	return verifier{key}.Verify(context.Background(), blob, sig)
}

// imagePayload is cosign's simple-signing payload for the image index: its digest, and the
// repository the chart pulls it from as the identity the signer claims.
func imagePayload(repository string, index v1.Hash) ([]byte, error) {
	d, err := name.NewDigest(repository + "@" + index.String())
	if err != nil {
		return nil, fmt.Errorf("the image %s@%s: %w", repository, index, err)
	}
	return json.Marshal(payload.Cosign{Image: d})
}

// signEnvelope is the DSSE envelope of an in-toto statement, signed.
func signEnvelope(key *ecdsa.PrivateKey, statement []byte) ([]byte, error) {
	es, err := dsse.NewEnvelopeSigner(signer{key})
	if err != nil {
		return nil, err
	}
	env, err := es.SignPayload(context.Background(), string(intotoMediaType), statement)
	if err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// openEnvelope verifies a DSSE envelope with the key and returns its in-toto statement.
func openEnvelope(key *ecdsa.PublicKey, raw []byte) ([]byte, error) {
	var env dsse.Envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("reading the DSSE envelope: %w", err)
	}
	if env.PayloadType != string(intotoMediaType) {
		return nil, fmt.Errorf("the DSSE envelope holds a %q, want %s", env.PayloadType, intotoMediaType)
	}
	ev, err := dsse.NewEnvelopeVerifier(verifier{key})
	if err != nil {
		return nil, err
	}
	_, statement, err := ev.VerifyAndDecode(context.Background(), &env)
	if err != nil {
		return nil, fmt.Errorf("the DSSE envelope: %w", err)
	}
	return statement, nil
}

// cosignLayer is one layer of a signature image: a payload (or an envelope) and its annotations.
type cosignLayer struct {
	mediaType   types.MediaType
	body        []byte
	annotations map[string]string
}

// appendSignatures writes into the layout at dir an image of cosign's signature layout, its
// layers the given ones, listed in index.json under cosign's tag for the index and the kind
// `cosign verify --local-image` looks for.
func appendSignatures(dir string, index v1.Hash, suffix, kind string, layers ...cosignLayer) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range layers {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(l.body, l.mediaType), Annotations: l.annotations}); err != nil {
			return err
		}
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{refAnnotation: cosignTag(index, suffix), kindAnnotation: kind}))
}

// markIndex adds cosign's kind to the image index's entry in index.json, where `cosign verify
// --local-image` finds what the signatures are of.
func markIndex(dir string, index v1.Hash) error {
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return err
	}
	m, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	marked := 0
	for i, d := range m.Manifests {
		if d.Digest == index && d.MediaType.IsIndex() {
			if m.Manifests[i].Annotations == nil {
				m.Manifests[i].Annotations = map[string]string{}
			}
			m.Manifests[i].Annotations[kindAnnotation] = kindImageIndex
			marked++
		}
	}
	if marked != 1 {
		return fmt.Errorf("index.json lists the image index %s %d times, want once", index, marked)
	}
	out, err := json.MarshalIndent(m, "", "   ")
	if err != nil {
		return err
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	return p.WriteFile("index.json", out, 0o644)
}

// sign signs a release being written in out: the image index, the provenance statement,
// into the layout and beside it, and writes the public key.
func sign(o options, img image, statement []byte) error {
	layoutDir := filepath.Join(o.out, imageDir)
	pl, err := imagePayload(o.imageRepository, img.desc.Digest)
	if err != nil {
		return err
	}
	sig, err := signer{o.key}.Sign(context.Background(), pl)
	if err != nil {
		return err
	}
	if err := appendSignatures(layoutDir, img.desc.Digest, "sig", kindSignatures, cosignLayer{
		mediaType:   simpleSigningMediaType,
		body:        pl,
		annotations: map[string]string{signatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	}); err != nil {
		return fmt.Errorf("writing the image index's signature: %w", err)
	}
	env, err := signEnvelope(o.key, statement)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, envelopeFile(o.version)), env, 0o644); err != nil {
		return err
	}
	if err := appendSignatures(layoutDir, img.desc.Digest, "att", kindAttestations, cosignLayer{
		mediaType: dsseMediaType,
		body:      env,
		// cosign's attestations carry an empty signature annotation: the signature is in the envelope.
		annotations: map[string]string{signatureAnnotation: "", predicateTypeAnnotation: provenanceType},
	}); err != nil {
		return fmt.Errorf("writing the provenance attestation: %w", err)
	}
	pub, err := publicKeyPEM(&o.key.PublicKey)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, publicKeyFile), pub, 0o644)
}
