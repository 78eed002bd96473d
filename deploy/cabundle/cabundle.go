// Package cabundle is the CA certificate bundle the health-router image ships: Mozilla's roots
// as the module golang.org/x/crypto/x509roots/fallback holds them at the version go.mod pins,
// PEM-encoded. deploy/image puts it in the image; deploy/release lists it in the SBOM under that
// module's version and checks that the image's file is this one.
package cabundle

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"runtime/debug"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Path is where the image has the bundle (SSL_CERT_FILE points there).
const Path = "/etc/ssl/certs/ca-certificates.crt"

// Module is the Go module whose roots the bundle holds.
const Module = "golang.org/x/crypto/x509roots/fallback"

// Pinned is the bundle: the module's roots, PEM-encoded in its order. A root the module
// distrusts after a date is left out: a PEM file cannot carry the date, and leaving it out is
// the safe side (a certificate issued under it before the date fails; none of AWS's does).
func Pinned() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}) // a bytes.Buffer does not fail
	}
	return b.Bytes()
}

// Version is the version of Module built into the running program: the one go.mod pins, as
// the program that calls it imports this package. Go records it in a main package's build
// information (a program's, or its tests'), not in a test of another package.
func Version() (string, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information: cannot tell the version of %s", Module)
	}
	return versionIn(bi)
}

// versionIn is Module's version in a program's build information: the replacement's, when
// go.mod replaces it.
func versionIn(bi *debug.BuildInfo) (string, error) {
	for _, d := range bi.Deps {
		if d.Path != Module {
			continue
		}
		if d.Replace != nil {
			return d.Replace.Version, nil
		}
		return d.Version, nil
	}
	return "", fmt.Errorf("%s is not in the build information", Module)
}
