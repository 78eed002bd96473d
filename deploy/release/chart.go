package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"
)

// chartValues is what the release reads of and writes into the chart's values.
type chartValues struct {
	Image struct {
		Repository string `json:"repository"`
		Digest     string `json:"digest"`
	} `json:"image"`
}

// chartRepository is the image repository the chart pulls from by default: the identity the
// image's signature claims and the name the provenance gives the image.
func chartRepository(chart string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		return "", err
	}
	var v chartValues
	if err := yaml.Unmarshal(raw, &v); err != nil {
		return "", fmt.Errorf("%s/values.yaml: %w", chart, err)
	}
	if v.Image.Repository == "" {
		return "", fmt.Errorf("%s/values.yaml has no image.repository", chart)
	}
	return v.Image.Repository, nil
}

// setImageDigest sets image.digest in a chart's values.yaml to the image index's digest, so that
// a default install pulls the released image by digest. It edits the one line `  digest: ""`
// of the top-level image block, keeping every comment (helm show values prints them).
func setImageDigest(values []byte, digest v1.Hash) ([]byte, error) {
	lines := strings.SplitAfter(string(values), "\n")
	inImage, at := false, -1
	for i, l := range lines {
		if l != "" && l[0] != ' ' && l[0] != '#' && l[0] != '\n' { // a top-level key
			inImage = strings.HasPrefix(l, "image:")
			continue
		}
		if inImage && strings.TrimRight(l, "\n") == `  digest: ""` {
			if at >= 0 {
				return nil, errors.New(`image has two lines "digest:"`)
			}
			at = i
		}
	}
	if at < 0 {
		return nil, errors.New(`no line "  digest: \"\"" under image:, for the release's digest`)
	}
	lines[at] = `  digest: "` + digest.String() + "\"\n"
	out := []byte(strings.Join(lines, ""))
	var v chartValues
	if err := yaml.Unmarshal(out, &v); err != nil || v.Image.Digest != digest.String() {
		return nil, fmt.Errorf("setting image.digest: read back %q, %v", v.Image.Digest, err)
	}
	return out, nil
}

// packageChart packages the chart with helm at the release's version, with image.digest set
// to the image index's, and writes it with SOURCE_DATE_EPOCH as every entry's time (helm stamps
// the time of packaging).
func packageChart(o options, work string, index v1.Hash) error {
	dir := filepath.Join(work, "chart")
	var stderr bytes.Buffer
	cmd := exec.Command(o.helm, "package", o.chart, "--version", o.version, "--app-version", o.version, "--destination", dir)
	// helm's own state stays out of the user's home.
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(work, "helm-config"), "HELM_CACHE_HOME="+filepath.Join(work, "helm-cache"), "HELM_DATA_HOME="+filepath.Join(work, "helm-data"))
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm package %s: %w\n%s", o.chart, err, stderr.String())
	}
	packaged, err := os.ReadFile(filepath.Join(dir, chartFile(o.version)))
	if err != nil {
		return fmt.Errorf("helm package %s: %w", o.chart, err)
	}
	set := 0
	chart, err := retime(packaged, o.epoch, func(name string, body []byte) ([]byte, error) {
		if dir, file, _ := strings.Cut(name, "/"); dir == "" || file != "values.yaml" {
			return body, nil
		}
		set++
		return setImageDigest(body, index)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", chartFile(o.version), err)
	}
	if set != 1 {
		return fmt.Errorf("%s: %d values.yaml at its top, want one", chartFile(o.version), set)
	}
	return os.WriteFile(filepath.Join(o.out, chartFile(o.version)), chart, 0o644)
}
