package cabundle

import (
	"crypto/x509"
	"encoding/pem"
	"runtime/debug"
	"strings"
	"testing"
)

func TestPinned(t *testing.T) {
	rest := Pinned()
	n, amazon := 0, false
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatalf("certificate %d: %v", n, err)
		}
		amazon = amazon || c.Subject.CommonName == "Amazon Root CA 1"
		n++
	}
	if n < 50 || len(strings.TrimSpace(string(rest))) > 0 || !amazon {
		t.Errorf("%d certificates, %d bytes left over, Amazon Root CA 1 %t: want Mozilla's roots, AWS's among them", n, len(rest), amazon)
	}
}

func TestVersionIn(t *testing.T) {
	for _, tt := range []struct {
		name    string
		deps    []*debug.Module
		want    string
		wantErr bool
	}{
		{name: "pinned", deps: []*debug.Module{{Path: "a.io/x", Version: "v1.0.0"}, {Path: Module, Version: "v0.0.0-20261030153154-30a33513ff6d"}}, want: "v0.0.0-20261030153154-30a33513ff6d"},
		{name: "replaced", deps: []*debug.Module{{Path: Module, Version: "v0.1.0", Replace: &debug.Module{Path: Module, Version: "v0.2.0"}}}, want: "v0.2.0"},
		{name: "absent", deps: []*debug.Module{{Path: "golang.org/x/crypto", Version: "v0.58.0"}}, wantErr: true},
	} {
		got, err := versionIn(&debug.BuildInfo{Deps: tt.deps})
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: %q, %v; want %q (error %t)", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
