package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	slsa "github.com/in-toto/attestation/go/predicates/provenance/v1"
	intoto "github.com/in-toto/attestation/go/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The provenance is an in-toto Statement v1 whose predicate is SLSA Provenance v1
// (slsa.dev/spec/v1.0/provenance): what the release is (its subjects: the image index and every
// file beside it, by SHA-256), what it was built from (the commit of the source repository, the
// Go toolchain), how (the make target and its parameters) and by whom (the builder id). It is
// made with the in-toto Go bindings (github.com/in-toto/attestation), whose Validate methods
// check what the two specifications require.
const (
	provenanceType = "https://slsa.dev/provenance/v1"
	// buildType names this build's template and parameters: docs/releasing.md describes them.
	buildType = "https://github.com/health-router/health-router/blob/main/docs/releasing.md#provenance"
	// defaultBuilderID is the builder when nothing more specific is said (--builder-id): this
	// command, on whatever machine ran it.
	defaultBuilderID = "https://github.com/health-router/health-router/tree/main/deploy/release"
)

// gitCommit is a commit's full SHA-1, the only form in-toto's gitCommit digest takes.
var gitCommit = regexp.MustCompile(`^[0-9a-f]{40}$`)

// subject is one thing the provenance is about: a release file, or the image index.
type subject struct{ name, sha256 string }

// releaseFiles are the subjects among the files at the top of dir: every regular file but
// SHA256SUMS and the files that sign or attest the others (written after the provenance).
func releaseFiles(dir, version string) ([]subject, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []subject
	for _, e := range entries {
		if !e.Type().IsRegular() || !attested(e.Name(), version) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, subject{e.Name(), hex.EncodeToString(h.Sum(nil))})
	}
	return out, nil
}

// attested says whether a file at the top of a release is a subject of its provenance.
func attested(name, version string) bool {
	switch name {
	case sumsFile, sumsSigFile, publicKeyFile, provenanceFile(version), envelopeFile(version):
		return false
	}
	return true
}

// provenance is the release's in-toto statement, as JSON.
func provenance(o options, img image, goVersion string, files []subject) ([]byte, error) {
	subjects := []*intoto.ResourceDescriptor{{Name: o.imageRepository, Digest: map[string]string{"sha256": img.desc.Digest.Hex}}}
	for _, f := range files {
		subjects = append(subjects, &intoto.ResourceDescriptor{Name: f.name, Digest: map[string]string{"sha256": f.sha256}})
	}
	source := &intoto.ResourceDescriptor{Name: "source", Uri: "git+" + o.source + "@" + o.revision}
	if gitCommit.MatchString(o.revision) {
		source.Digest = map[string]string{"gitCommit": o.revision}
	}
	external, err := structpb.NewStruct(map[string]any{
		"invocation":      o.invocation,
		"version":         o.version,
		"source":          o.source,
		"package":         o.pkg,
		"chart":           o.chart,
		"platforms":       platformList(o.platforms),
		"imagePlatforms":  platformList(o.imagePlatforms),
		"imageRepository": o.imageRepository,
	})
	if err != nil {
		return nil, err
	}
	internal, err := structpb.NewStruct(map[string]any{
		"SOURCE_DATE_EPOCH": strconv.FormatInt(o.epoch.Unix(), 10),
	})
	if err != nil {
		return nil, err
	}
	// Both times are SOURCE_DATE_EPOCH, the commit's: a time of building would make two
	// builds of one commit differ.
	at := timestamppb.New(o.epoch)
	pred := &slsa.Provenance{
		BuildDefinition: &slsa.BuildDefinition{
			BuildType:          buildType,
			ExternalParameters: external,
			InternalParameters: internal,
			ResolvedDependencies: []*intoto.ResourceDescriptor{
				source,
				{Name: "go", Uri: purl("stdlib", goVersion)},
			},
		},
		RunDetails: &slsa.RunDetails{
			Builder:  &slsa.Builder{Id: o.builderID},
			Metadata: &slsa.BuildMetadata{StartedOn: at, FinishedOn: at},
		},
	}
	if err := pred.Validate(); err != nil {
		return nil, fmt.Errorf("the provenance: %w", err)
	}
	predicate, err := toStruct(pred)
	if err != nil {
		return nil, err
	}
	st := &intoto.Statement{
		Type:          intoto.StatementTypeUri,
		Subject:       subjects,
		PredicateType: provenanceType,
		Predicate:     predicate,
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("the provenance statement: %w", err)
	}
	return stableJSON(st)
}

func platformList(ps []platform) []any {
	var out []any
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// toStruct is a message as the google.protobuf.Struct a statement's predicate is.
func toStruct(m proto.Message) (*structpb.Struct, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	s := &structpb.Struct{}
	return s, protojson.Unmarshal(b, s)
}

// stableJSON is protojson's encoding with its whitespace made fixed: protojson varies it on
// purpose from one build of a program to another, and the release must be the same bytes from
// any builder. protojson's order of fields (the message's) and of map keys (sorted) is stable.
func stableJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, err
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// readProvenance parses a provenance statement and checks it as the in-toto and SLSA
// specifications require, and that it is a v1 statement of SLSA provenance v1.
func readProvenance(raw []byte) (*intoto.Statement, *slsa.Provenance, error) {
	st := &intoto.Statement{}
	if err := protojson.Unmarshal(raw, st); err != nil {
		return nil, nil, fmt.Errorf("reading the provenance statement: %w", err)
	}
	if err := st.Validate(); err != nil {
		return nil, nil, fmt.Errorf("the provenance statement: %w", err)
	}
	if st.GetType() != intoto.StatementTypeUri || st.GetPredicateType() != provenanceType {
		return nil, nil, fmt.Errorf("the provenance statement is a %s of %s, want a %s of %s", st.GetType(), st.GetPredicateType(), intoto.StatementTypeUri, provenanceType)
	}
	b, err := protojson.Marshal(st.GetPredicate())
	if err != nil {
		return nil, nil, err
	}
	pred := &slsa.Provenance{}
	if err := protojson.Unmarshal(b, pred); err != nil {
		return nil, nil, fmt.Errorf("reading the provenance predicate: %w", err)
	}
	if err := pred.Validate(); err != nil {
		return nil, nil, fmt.Errorf("the provenance predicate: %w", err)
	}
	return st, pred, nil
}

// checkSubjects compares a statement's subjects with what the release holds: the image index
// (under whatever name) and each file by its name and SHA-256, none missing, none more.
func checkSubjects(st *intoto.Statement, index v1.Hash, files []subject) error {
	var got []subject
	indexes := 0
	for _, s := range st.GetSubject() {
		sum := s.GetDigest()["sha256"]
		if index.Algorithm == "sha256" && sum == index.Hex {
			indexes++
			continue
		}
		got = append(got, subject{s.GetName(), sum})
	}
	var errs []error
	if indexes != 1 {
		errs = append(errs, fmt.Errorf("the provenance names the image index %s %d times, want once", index, indexes))
	}
	for _, f := range files {
		if !slices.Contains(got, f) {
			errs = append(errs, fmt.Errorf("the provenance does not name %s sha256:%s", f.name, f.sha256))
		}
	}
	for _, g := range got {
		if !slices.Contains(files, g) {
			errs = append(errs, fmt.Errorf("the provenance names %s sha256:%s, which the release does not hold", g.name, g.sha256))
		}
	}
	return errors.Join(errs...)
}
