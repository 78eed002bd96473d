package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	intoto "github.com/in-toto/attestation/go/v1"
)

const testRevision = "0123456789abcdef0123456789abcdef01234567"

func testOptions() options {
	return options{
		version: "1.2.3", revision: testRevision, source: "https://github.com/health-router/health-router",
		pkg: "./cmd/health-router", chart: "deploy/charts/health-router",
		platforms:      []platform{{"linux", "amd64"}, {"darwin", "arm64"}},
		imagePlatforms: []platform{{"linux", "amd64"}, {"linux", "arm64"}},
		epoch:          time.Unix(1763726400, 0).UTC(),
		invocation:     "make release", builderID: defaultBuilderID,
		imageRepository: "ghcr.io/health-router/health-router",
	}
}

// TestProvenance checks the statement's content: an in-toto Statement v1 of SLSA provenance
// v1 about the image index and the files, built from the commit by the make target, at
// SOURCE_DATE_EPOCH.
func TestProvenance(t *testing.T) {
	o := testOptions()
	index := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	img := image{desc: v1.Descriptor{Digest: index}}
	files := []subject{{"health-router-1.2.3.tgz", strings.Repeat("01", 32)}, {"health-router_1.2.3_sbom.spdx.json", strings.Repeat("02", 32)}}
	raw, err := provenance(o, img, "go1.26.10", files)
	if err != nil {
		t.Fatal(err)
	}
	again, err := provenance(o, img, "go1.26.10", files)
	if err != nil || string(again) != string(raw) {
		t.Errorf("a second statement of the same release differs (err %v)", err)
	}
	if !strings.HasPrefix(string(raw), "{\n  \"_type\": \"https://in-toto.io/Statement/v1\",\n  \"subject\": [") {
		t.Errorf("the statement does not begin as in-toto's (its fields in the specification's order):\n%s", raw)
	}

	var st struct {
		Type    string `json:"_type"`
		Subject []struct {
			Name   string            `json:"name"`
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
		PredicateType string `json:"predicateType"`
		Predicate     struct {
			BuildDefinition struct {
				BuildType            string         `json:"buildType"`
				ExternalParameters   map[string]any `json:"externalParameters"`
				InternalParameters   map[string]any `json:"internalParameters"`
				ResolvedDependencies []struct {
					Name   string            `json:"name"`
					URI    string            `json:"uri"`
					Digest map[string]string `json:"digest"`
				} `json:"resolvedDependencies"`
			} `json:"buildDefinition"`
			RunDetails struct {
				Builder  struct{ ID string } `json:"builder"`
				Metadata struct {
					StartedOn  string `json:"startedOn"`
					FinishedOn string `json:"finishedOn"`
				} `json:"metadata"`
			} `json:"runDetails"`
		} `json:"predicate"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != "https://in-toto.io/Statement/v1" || st.PredicateType != "https://slsa.dev/provenance/v1" {
		t.Errorf("_type %q predicateType %q", st.Type, st.PredicateType)
	}
	var subjects []string
	for _, s := range st.Subject {
		subjects = append(subjects, s.Name+"@"+s.Digest["sha256"])
	}
	wantSubjects := []string{"ghcr.io/health-router/health-router@" + index.Hex, files[0].name + "@" + files[0].sha256, files[1].name + "@" + files[1].sha256}
	if strings.Join(subjects, " ") != strings.Join(wantSubjects, " ") {
		t.Errorf("subjects %q, want the image index and the files %q", subjects, wantSubjects)
	}
	bd := st.Predicate.BuildDefinition
	if bd.BuildType != buildType {
		t.Errorf("buildType %q", bd.BuildType)
	}
	ext := bd.ExternalParameters
	if ext["invocation"] != "make release" || ext["version"] != "1.2.3" || ext["imageRepository"] != o.imageRepository ||
		len(ext["platforms"].([]any)) != 2 || ext["imagePlatforms"].([]any)[1] != "linux/arm64" {
		t.Errorf("externalParameters %v", ext)
	}
	if bd.InternalParameters["SOURCE_DATE_EPOCH"] != "1763726400" {
		t.Errorf("internalParameters %v", bd.InternalParameters)
	}
	deps := bd.ResolvedDependencies
	if len(deps) != 2 || deps[0].URI != "git+https://github.com/health-router/health-router@"+testRevision || deps[0].Digest["gitCommit"] != testRevision ||
		deps[1].URI != "pkg:golang/stdlib@go1.26.10" {
		t.Errorf("resolvedDependencies %+v: want the commit and the Go toolchain", deps)
	}
	rd := st.Predicate.RunDetails
	if rd.Builder.ID != defaultBuilderID || rd.Metadata.StartedOn != "2025-11-21T12:00:00Z" || rd.Metadata.FinishedOn != "2025-11-21T12:00:00Z" {
		t.Errorf("runDetails %+v: want the builder and SOURCE_DATE_EPOCH", rd)
	}

	if _, _, err := readProvenance(raw); err != nil {
		t.Errorf("readProvenance of what provenance wrote: %v", err)
	}

	// A revision that is not a full commit (make's "unknown" outside git) is named, not digested.
	o.revision = "unknown"
	raw, err = provenance(o, img, "go1.26.10", files)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "gitCommit") {
		t.Errorf("a gitCommit digest of %q", o.revision)
	}
}

func TestReadProvenance(t *testing.T) {
	valid, err := provenance(testOptions(), image{desc: v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}}}, "go1.26.10", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		raw     string
		wantErr string
	}{
		{name: "valid", raw: string(valid)},
		{name: "legacy statement", raw: strings.Replace(string(valid), "Statement/v1", "Statement/v0.1", 1), wantErr: "want a https://in-toto.io/Statement/v1"},
		{name: "other predicate", raw: strings.Replace(string(valid), "https://slsa.dev/provenance/v1", "https://slsa.dev/provenance/v0.2", 1), wantErr: "provenance/v0.2"},
		{name: "no builder", raw: strings.Replace(string(valid), defaultBuilderID, "", 1), wantErr: "builder"},
		{name: "a short digest", raw: strings.Replace(string(valid), strings.Repeat("ab", 32), "abab", 1), wantErr: "digest"},
		{name: "not JSON", raw: "DSSEv1", wantErr: "reading"},
	} {
		_, _, err := readProvenance([]byte(tt.raw))
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestCheckSubjects(t *testing.T) {
	index := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	a, b := subject{"a.tgz", strings.Repeat("01", 32)}, subject{"b.tar.gz", strings.Repeat("02", 32)}
	st := func(subjects ...subject) *intoto.Statement {
		s := &intoto.Statement{}
		for _, x := range subjects {
			s.Subject = append(s.Subject, &intoto.ResourceDescriptor{Name: x.name, Digest: map[string]string{"sha256": x.sha256}})
		}
		return s
	}
	img := subject{"ghcr.io/health-router/health-router", index.Hex}
	for _, tt := range []struct {
		name    string
		st      *intoto.Statement
		files   []subject
		wantErr string
	}{
		{name: "the index and the files", st: st(img, a, b), files: []subject{b, a}},
		{name: "a file missing", st: st(img, a), files: []subject{a, b}, wantErr: "does not name b.tar.gz"},
		{name: "a file changed", st: st(img, a, subject{b.name, strings.Repeat("03", 32)}), files: []subject{a, b}, wantErr: "does not name b.tar.gz"},
		{name: "a file more", st: st(img, a, b), files: []subject{a}, wantErr: "names b.tar.gz"},
		{name: "another index", st: st(subject{img.name, strings.Repeat("cd", 32)}, a), files: []subject{a}, wantErr: "image index"},
		{name: "no index", st: st(a), files: []subject{a}, wantErr: "0 times"},
	} {
		err := checkSubjects(tt.st, index, tt.files)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.wantErr)
		}
	}
}
