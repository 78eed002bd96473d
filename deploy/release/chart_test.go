package main

import (
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestChartRepository(t *testing.T) {
	got, err := chartRepository("../charts/health-router")
	if err != nil || got != "ghcr.io/health-router/health-router" {
		t.Errorf("chartRepository = %q, %v; want the chart's default image.repository", got, err)
	}
}

func TestSetImageDigest(t *testing.T) {
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	chart, err := os.ReadFile("../charts/health-router/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, in, want, wantErr string
	}{
		{name: "the chart's values", in: string(chart), want: strings.Replace(string(chart), "  digest: \"\"\n", "  digest: \""+d.String()+"\"\n", 1)},
		{
			name: "comments kept, other digests left alone",
			in:   "# -- x\nother:\n  digest: \"\"\nimage:\n  # -- Digest.\n  digest: \"\"\n# -- Pull policy.\npull: IfNotPresent\n",
			want: "# -- x\nother:\n  digest: \"\"\nimage:\n  # -- Digest.\n  digest: \"" + d.String() + "\"\n# -- Pull policy.\npull: IfNotPresent\n",
		},
		{name: "no digest under image", in: "image:\n  tag: \"\"\nother:\n  digest: \"\"\n", wantErr: "no line"},
		{name: "a digest set already", in: "image:\n  digest: \"sha256:00\"\n", wantErr: "no line"},
		{name: "two", in: "image:\n  digest: \"\"\n  digest: \"\"\n", wantErr: "two"},
	} {
		got, err := setImageDigest([]byte(tt.in), d)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("%s: %v\n%s\nwant\n%s", tt.name, err, got, tt.want)
		}
	}
}
