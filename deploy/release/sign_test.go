package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
)

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pkcs8PEM(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// writeKey writes a key file and returns its path.
func writeKey(t *testing.T, body []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(path, body, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadSigningKey(t *testing.T) {
	key := newKey(t)
	sec1, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// As `cosign generate-key-pair` writes a key: PKCS #8, encrypted with the password.
	enc, err := encrypted.Encrypt(der, []byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publicKeyPEM(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	block := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	for _, tt := range []struct {
		name     string
		pem      []byte
		password []byte
		wantErr  string
	}{
		{name: "PKCS #8", pem: pkcs8PEM(t, key)},
		{name: "EC", pem: block("EC PRIVATE KEY", sec1)},
		{name: "cosign's encrypted key", pem: block("ENCRYPTED SIGSTORE PRIVATE KEY", enc), password: []byte("s3cret")},
		{name: "an older cosign's encrypted key", pem: block("ENCRYPTED COSIGN PRIVATE KEY", enc), password: []byte("s3cret")},
		{name: "encrypted, no password", pem: block("ENCRYPTED SIGSTORE PRIVATE KEY", enc), wantErr: "COSIGN_PASSWORD"},
		{name: "encrypted, wrong password", pem: block("ENCRYPTED SIGSTORE PRIVATE KEY", enc), password: []byte("guess"), wantErr: "decrypting"},
		{name: "P-384", pem: pkcs8PEM(t, p384), wantErr: "P-256"},
		{name: "RSA", pem: pkcs8PEM(t, rsaKey), wantErr: "P-256"},
		{name: "a public key", pem: pub, wantErr: `"PUBLIC KEY"`},
		{name: "not PEM", pem: []byte("hunter2"), wantErr: "no PEM block"},
	} {
		got, err := loadSigningKey(tt.pem, tt.password)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !got.Equal(key) {
			t.Errorf("%s: %v; want the key", tt.name, err)
		}
	}
}

func TestLoadPublicKey(t *testing.T) {
	key := newKey(t)
	pub, err := publicKeyPEM(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(pub), "-----BEGIN PUBLIC KEY-----\n") {
		t.Errorf("cosign.pub %q: want a PEM PUBLIC KEY, as cosign writes", pub)
	}
	got, err := loadPublicKey(pub)
	if err != nil || !got.Equal(&key.PublicKey) {
		t.Errorf("loadPublicKey(cosign.pub) = %v, %v", got, err)
	}
	if _, err := loadPublicKey(pkcs8PEM(t, key)); err == nil {
		t.Error("loadPublicKey of a private key: want an error")
	}
}

// TestSignBlob: SHA256SUMS.sig as cosign sign-blob writes it, and what fails to verify.
func TestSignBlob(t *testing.T) {
	key, other := newKey(t), newKey(t)
	sums := []byte("0123  a.tgz\n")
	sig, err := signBlob(key, sums)
	if err != nil {
		t.Fatal(err)
	}
	again, err := signBlob(key, sums)
	if err != nil || string(again) != string(sig) {
		t.Errorf("two signatures of one file differ: the release would not be reproducible")
	}
	der, err := base64.StdEncoding.DecodeString(string(sig))
	if err != nil {
		t.Fatalf("the signature %q is not base64: %v", sig, err)
	}
	if h := sha256.Sum256(sums); !ecdsa.VerifyASN1(&key.PublicKey, h[:], der) {
		t.Error("the signature is not ECDSA (ASN.1) over the file's SHA-256, as cosign verify-blob checks")
	}
	for _, tt := range []struct {
		name string
		key  *ecdsa.PrivateKey
		blob []byte
		sig  []byte
		ok   bool
	}{
		{name: "as signed", key: key, blob: sums, sig: sig, ok: true},
		{name: "with a newline", key: key, blob: sums, sig: append([]byte(string(sig)), '\n'), ok: true},
		{name: "the file tampered", key: key, blob: []byte("0124  a.tgz\n"), sig: sig},
		{name: "another key", key: other, blob: sums, sig: sig},
		{name: "not base64", key: key, blob: sums, sig: []byte("!!")},
		{name: "empty", key: key, blob: sums, sig: nil},
	} {
		err := verifyBlob(&tt.key.PublicKey, tt.blob, tt.sig)
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v, want ok %t", tt.name, err, tt.ok)
		}
	}
}

// TestImagePayload: cosign's simple-signing payload, byte for byte as `cosign sign` writes it.
func TestImagePayload(t *testing.T) {
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	got, err := imagePayload("ghcr.io/health-router/health-router", d)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"critical":{"identity":{"docker-reference":"ghcr.io/health-router/health-router"},"image":{"docker-manifest-digest":"sha256:` + d.Hex + `"},"type":"cosign container image signature"},"optional":null}`
	if string(got) != want {
		t.Errorf("payload\n%s\nwant\n%s", got, want)
	}
	if _, err := imagePayload("Not A Repository", d); err == nil {
		t.Error("a payload for an invalid repository: want an error")
	}
}

// TestEnvelope: the provenance's DSSE envelope, as cosign attest makes, and what fails to verify.
func TestEnvelope(t *testing.T) {
	key, other := newKey(t), newKey(t)
	statement := []byte(`{"_type":"https://in-toto.io/Statement/v1"}`)
	env, err := signEnvelope(key, statement)
	if err != nil {
		t.Fatal(err)
	}
	var e dsse.Envelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	if e.PayloadType != "application/vnd.in-toto+json" || e.Payload != base64.StdEncoding.EncodeToString(statement) || len(e.Signatures) != 1 || e.Signatures[0].KeyID != "" {
		t.Errorf("envelope %s: want the statement as an in-toto payload, one signature without a key id", env)
	}
	// DSSE signs the pre-authentication encoding, not the payload alone.
	sig, _ := base64.StdEncoding.DecodeString(e.Signatures[0].Sig)
	if h := sha256.Sum256(dsse.PAE(e.PayloadType, statement)); !ecdsa.VerifyASN1(&key.PublicKey, h[:], sig) {
		t.Error("the signature is not over DSSE's PAE(payloadType, payload)")
	}
	tamper := func(f func(e *dsse.Envelope)) []byte {
		var c dsse.Envelope
		if err := json.Unmarshal(env, &c); err != nil {
			t.Fatal(err)
		}
		f(&c)
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tt := range []struct {
		name    string
		key     *ecdsa.PrivateKey
		env     []byte
		wantErr string
	}{
		{name: "as signed", key: key, env: env},
		{name: "another key", key: other, env: env, wantErr: "DSSE envelope"},
		{name: "the payload swapped", key: key, env: tamper(func(e *dsse.Envelope) {
			e.Payload = base64.StdEncoding.EncodeToString([]byte(`{"_type":"https://in-toto.io/Statement/v1","subject":[]}`))
		}), wantErr: "DSSE envelope"},
		{name: "another payload type", key: key, env: tamper(func(e *dsse.Envelope) { e.PayloadType = "text/plain" }), wantErr: "text/plain"},
		{name: "no signature", key: key, env: tamper(func(e *dsse.Envelope) { e.Signatures = nil }), wantErr: "no signature"},
		{name: "not JSON", key: key, env: []byte("DSSEv1"), wantErr: "reading"},
	} {
		got, err := openEnvelope(&tt.key.PublicKey, tt.env)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || string(got) != string(statement) {
			t.Errorf("%s: %q, %v; want the statement", tt.name, got, err)
		}
	}
}
