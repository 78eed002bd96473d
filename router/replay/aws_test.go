package replay

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// writeFiles writes name -> content into a new directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/ec2", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// summary is what the checks read from an AWSFile, as strings: easy to compare.
func summary(a *AWSFile) []string {
	var out []string
	for _, im := range a.Images {
		out = append(out, strings.Join([]string{"image", aws.ToString(im.ImageId), string(im.State), aws.ToString(im.Name), string(im.Architecture)}, " "))
	}
	for _, cr := range a.CapacityReservations {
		out = append(out, strings.Join([]string{"reservation", aws.ToString(cr.CapacityReservationId), string(cr.State), aws.ToString(cr.InstanceType),
			aws.ToString(cr.AvailabilityZone), itoa(cr.TotalInstanceCount), itoa(cr.AvailableInstanceCount)}, " "))
	}
	return out
}

func itoa(p *int32) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(int(*p))
}

func TestLoadAWS(t *testing.T) {
	images := readTestdata(t, "describe-images.json")
	reservations := readTestdata(t, "describe-capacity-reservations.json")
	for _, tc := range []struct {
		name  string
		files map[string]string // one file: --aws names the file; more: the directory
		want  []string
	}{
		{"describe-images output", map[string]string{"images.json": images}, []string{
			"image ami-0c55b159cbfafe1f0 available amazon-eks-node-al2023-x86_64-standard-1.34-v20261118 x86_64",
			"image ami-0d7e3f4a5b6c7d8e9 available amazon-eks-node-al2023-arm64-standard-1.34-v20261118 arm64",
			"image ami-0e1f2a3b4c5d6e7f8 pending amazon-eks-node-al2023-x86_64-nvidia-1.34-v20261118 x86_64",
			"image ami-0f0e0d0c0b0a09080 failed team-base-al2023-arm64-20260601 arm64",
		}},
		{"describe-capacity-reservations output", map[string]string{"crs.json": reservations}, []string{
			"reservation cr-0a1b2c3d4e5f60718 active m7i.2xlarge eu-west-1a 4 0",
			"reservation cr-0b2c3d4e5f6071829 expired p5.48xlarge eu-west-1b 2 2",
		}},
		{"a directory of both and the short YAML", map[string]string{"images.json": images, "crs.json": reservations,
			"extra.yaml": "images:\n  - id: ami-0123456789abcdef0\n    state: deregistered\n"}, []string{
			"reservation cr-0a1b2c3d4e5f60718 active m7i.2xlarge eu-west-1a 4 0",
			"reservation cr-0b2c3d4e5f6071829 expired p5.48xlarge eu-west-1b 2 2",
			"image ami-0123456789abcdef0 deregistered  ",
			"image ami-0c55b159cbfafe1f0 available amazon-eks-node-al2023-x86_64-standard-1.34-v20261118 x86_64",
			"image ami-0d7e3f4a5b6c7d8e9 available amazon-eks-node-al2023-arm64-standard-1.34-v20261118 arm64",
			"image ami-0e1f2a3b4c5d6e7f8 pending amazon-eks-node-al2023-x86_64-nvidia-1.34-v20261118 x86_64",
			"image ami-0f0e0d0c0b0a09080 failed team-base-al2023-arm64-20260601 arm64",
		}},
		{"short YAML with real EC2 fields beyond the documented ones", map[string]string{"aws.yaml": `
capacityReservations:
  - id: cr-0a1b2c3d4e5f60718
    state: active
    instanceType: m7i.2xlarge
    availabilityZone: eu-west-1a
    instanceMatchCriteria: targeted
    totalInstanceCount: 4
    availableInstanceCount: 1
    startDate: 2026-10-01T09:00:00Z
    tags: [{key: team, value: platform}]
`}, []string{"reservation cr-0a1b2c3d4e5f60718 active m7i.2xlarge eu-west-1a 4 1"}},
		{"EC2's field names in the YAML, and a NextToken", map[string]string{"aws.yaml": "NextToken: abc\nImages:\n  - ImageId: ami-1\n    State: available\n"},
			[]string{"image ami-1 available  "}},
		{"an empty list is an answer", map[string]string{"aws.json": `{"Images": []}`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, tc.files)
			path := dir
			if len(tc.files) == 1 {
				for name := range tc.files {
					path = filepath.Join(dir, name)
				}
			}
			a, err := LoadAWS(path)
			if err != nil {
				t.Fatal(err)
			}
			got := summary(a)
			if len(tc.files) > 1 { // summary lists images first, whatever the files' order
				if !reflect.DeepEqual(sortedCopy(got), sortedCopy(tc.want)) {
					t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
				}
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// TestLoadAWSTimes checks that the CLI's timestamps (v2's ISO 8601 with an offset, v1's
// wire form with milliseconds, an unquoted YAML time) decode into the SDK's types.
func TestLoadAWSTimes(t *testing.T) {
	a, err := LoadAWS("testdata/ec2/describe-capacity-reservations.json")
	if err != nil {
		t.Fatal(err)
	}
	cr := a.CapacityReservations[1]
	if want := time.Date(2026, 11, 14, 11, 30, 0, 0, time.UTC); cr.StartDate == nil || !cr.StartDate.Equal(want) {
		t.Errorf("StartDate %v, want %v", cr.StartDate, want)
	}
	if want := time.Date(2026, 11, 21, 11, 30, 0, 0, time.UTC); cr.EndDate == nil || !cr.EndDate.Equal(want) {
		t.Errorf("EndDate %v, want %v", cr.EndDate, want)
	}
	if cr.CreateDate == nil || cr.CreateDate.IsZero() {
		t.Errorf("CreateDate %v", cr.CreateDate)
	}
	if got := a.CapacityReservations[0].CapacityAllocations; len(got) != 1 || aws.ToInt32(got[0].Count) != 4 {
		t.Errorf("CapacityAllocations %+v", got)
	}

	b, err := LoadAWS("testdata/ec2/describe-images.json")
	if err != nil {
		t.Fatal(err)
	}
	im := b.Images[0]
	if aws.ToString(im.CreationDate) != "2026-11-18T21:14:03.000Z" || len(im.BlockDeviceMappings) != 1 || aws.ToInt32(im.BlockDeviceMappings[0].Ebs.Iops) != 3000 {
		t.Errorf("image 0: CreationDate %v, block devices %+v", aws.ToString(im.CreationDate), im.BlockDeviceMappings)
	}
	if r := b.Images[3].StateReason; r == nil || aws.ToString(r.Code) != "Client.InvalidSnapshot.NotFound" {
		t.Errorf("failed image's StateReason %+v", r)
	}

	dir := writeFiles(t, map[string]string{
		"v1.json":   `{"CapacityReservations": [{"CapacityReservationId": "cr-1", "State": "active", "StartDate": "2026-10-01T09:00:00.000Z"}]}`,
		"hand.yaml": "capacityReservations:\n  - id: cr-2\n    state: active\n    startDate: 2026-10-01T09:00:00Z\n",
	})
	c, err := LoadAWS(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 10, 1, 9, 0, 0, 0, time.UTC)
	for _, cr := range c.CapacityReservations {
		if cr.StartDate == nil || !cr.StartDate.Equal(want) {
			t.Errorf("%s: StartDate %v, want %v", aws.ToString(cr.CapacityReservationId), cr.StartDate, want)
		}
	}
}

func TestLoadAWSRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string // in the message
	}{
		{"a misspelt field", map[string]string{"aws.yaml": "images:\n  - id: ami-1\n    stat: available\n"}, []string{"aws.yaml", "images[0]", `unknown field "stat"`}},
		{"a field EC2 does not have on a reservation", map[string]string{"aws.yaml": "capacityReservations:\n  - id: cr-1\n    state: active\n    zone: eu-west-1a\n"}, []string{`unknown field "zone"`, "CapacityReservationId"}},
		{"an unknown top-level key", map[string]string{"aws.json": `{"Reservations": []}`}, []string{`unknown key "Reservations"`, "describe-images"}},
		{"neither list", map[string]string{"aws.json": `{"NextToken": "x"}`}, []string{"no Images, CapacityReservations or InstanceStatuses"}},
		{"not an object", map[string]string{"aws.json": `[{"ImageId": "ami-1"}]`}, []string{"want an object with Images, CapacityReservations or InstanceStatuses"}},
		{"a state EC2 does not have", map[string]string{"aws.yaml": "images:\n  - id: ami-1\n    state: availble\n"}, []string{`state "availble"`, "available", "deregistered"}},
		{"no state", map[string]string{"aws.json": `{"Images": [{"ImageId": "ami-1"}]}`}, []string{"Images[0]", "needs an id (ImageId) and a state"}},
		{"both id and ImageId", map[string]string{"aws.yaml": "images:\n  - id: ami-1\n    ImageId: ami-2\n    state: available\n"}, []string{"both id and ImageId"}},
		{"a wrong type", map[string]string{"aws.yaml": "capacityReservations:\n  - id: cr-1\n    state: active\n    totalInstanceCount: four\n"}, []string{"capacityReservations[0]", "TotalInstanceCount"}},
		{"an ID listed twice", map[string]string{"a.json": `{"Images": [{"ImageId": "ami-1", "State": "available"}]}`, "b.yaml": "images:\n  - id: ami-1\n    state: pending\n"},
			[]string{"ami-1 is listed twice", "a.json"}},
		{"an empty directory", map[string]string{".hidden": "x"}, []string{"no files in the directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, tc.files)
			path := dir
			if len(tc.files) == 1 && tc.files[".hidden"] == "" {
				for name := range tc.files {
					path = filepath.Join(dir, name)
				}
			}
			_, err := LoadAWS(path)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestReplayWithCLIOutput replays the demo against EC2 state as the CLI prints it: the
// decisions are those of the demo's hand-written aws.yaml, which says the same.
func TestReplayWithCLIOutput(t *testing.T) {
	want := replayDemo(t, "../../test/demo/aws.yaml")
	got := replayDemo(t, "testdata/ec2")
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%d rows from the CLI output, %d from aws.yaml", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}
