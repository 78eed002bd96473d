package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"sigs.k8s.io/yaml"
)

// AWSFile is what --aws holds: what EC2 would answer the pre-signal checks. The path is a
// file or a directory of files, each in one of two forms.
//
// What the AWS CLI prints, as is (JSON; EC2's own field names):
//
//	aws ec2 describe-images --image-ids ami-... --output json > images.json
//	aws ec2 describe-capacity-reservations --output json > reservations.json
//
// or a short YAML written by hand, whose keys are EC2's fields in camelCase, with id for
// ImageId or CapacityReservationId:
//
//	images:
//	  - id: ami-0c55b159cbfafe1f0
//	    name: al2023-ami-eks-1.34-x86_64   # optional
//	    state: available                   # pending | available | failed | deregistered | disabled ...
//	    architecture: x86_64               # optional, for people
//	capacityReservations:
//	  - id: cr-0a1b2c3d4e5f60718
//	    state: active                      # active | expired | cancelled | pending | failed ...
//	    instanceType: m7i.2xlarge          # optional
//	    availabilityZone: eu-west-1a       # optional; any other EC2 field is accepted too
//	    totalInstanceCount: 4
//	    availableInstanceCount: 1
//
// Any field of EC2's Image or CapacityReservation is accepted in both forms; a field EC2
// does not have is refused, naming it. An image or reservation not listed does not exist,
// as EC2 would say.
//
// For pools annotated healthrouter.io/reschedule=true, the instances' scheduled events
// (a what-if: replay moves nothing) come from what the CLI prints,
//
//	aws ec2 describe-instance-status --include-all-instances --output json > status.json
//
// or the short form:
//
//	instanceStatuses:
//	  - id: i-0a1b2c3d4e5f60001
//	    events:
//	      - instanceEventId: instance-event-0a1b2c3d4e5f60001
//	        code: system-reboot
//	        notBefore: "2026-12-01T12:00:00Z"
//	        notBeforeDeadline: "2026-12-15T12:00:00Z"
type AWSFile struct {
	Images               []ec2types.Image
	CapacityReservations []ec2types.CapacityReservation
	InstanceStatuses     []ec2types.InstanceStatus
}

// ec2Kind describes one top-level list of an --aws file: its key (as the CLI prints it),
// the EC2 type of its entries, and the EC2 field that the short form's id stands for.
type ec2Kind struct {
	key     string
	idField string
	fields  map[string]bool // EC2's field names, lower case: JSON decoding ignores case as well
	states  []string
}

func newEC2Kind(key, idField string, shape any, states []string) ec2Kind {
	k := ec2Kind{key: key, idField: idField, fields: map[string]bool{}, states: states}
	t := reflect.TypeOf(shape)
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); f.IsExported() {
			k.fields[strings.ToLower(f.Name)] = true
		}
	}
	return k
}

var (
	imageKind       = newEC2Kind("Images", "ImageId", ec2types.Image{}, enumStrings(ec2types.ImageState("").Values()))
	reservationKind = newEC2Kind("CapacityReservations", "CapacityReservationId", ec2types.CapacityReservation{}, enumStrings(ec2types.CapacityReservationState("").Values()))
	statusKind      = newEC2Kind("InstanceStatuses", "InstanceId", ec2types.InstanceStatus{}, enumStrings(ec2types.InstanceStateName("").Values()))
)

func enumStrings[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// LoadAWS reads --aws: one file, or every file of a directory (hidden files left out).
func LoadAWS(path string) (*AWSFile, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if info.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = nil
		for _, e := range entries {
			if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no files in the directory", path)
		}
	}
	a := &AWSFile{}
	seen := map[string]string{} // ID -> the file that listed it
	for _, f := range files {
		if err := a.load(f, seen); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// load adds one file's images and reservations to a; seen catches an ID listed twice.
func (a *AWSFile) load(path string, seen map[string]string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(b) // JSON is YAML: one decoder for both forms
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil || top == nil {
		return fmt.Errorf("%s: want an object with Images, CapacityReservations or InstanceStatuses (the output of aws ec2 describe-images, describe-capacity-reservations or describe-instance-status --output json, or the short YAML)", path)
	}
	found := false
	for _, key := range sortedKeys(top) {
		raw := top[key]
		switch strings.ToLower(key) {
		case "images":
			entries, err := decodeEntries(path, key, imageKind, raw)
			if err != nil {
				return err
			}
			for _, e := range entries {
				var im ec2types.Image
				if err := decodeEntry(e, &im); err != nil {
					return err
				}
				if err := e.check(aws.ToString(im.ImageId), string(im.State), seen); err != nil {
					return err
				}
				a.Images = append(a.Images, im)
			}
			found = true
		case "capacityreservations":
			entries, err := decodeEntries(path, key, reservationKind, raw)
			if err != nil {
				return err
			}
			for _, e := range entries {
				var cr ec2types.CapacityReservation
				if err := decodeEntry(e, &cr); err != nil {
					return err
				}
				if err := e.check(aws.ToString(cr.CapacityReservationId), string(cr.State), seen); err != nil {
					return err
				}
				a.CapacityReservations = append(a.CapacityReservations, cr)
			}
			found = true
		case "instancestatuses":
			entries, err := decodeEntries(path, key, statusKind, raw)
			if err != nil {
				return err
			}
			for _, e := range entries {
				var st ec2types.InstanceStatus
				if err := decodeEntry(e, &st); err != nil {
					return err
				}
				state := string(ec2types.InstanceStateNameRunning) // the short form may leave it out
				if st.InstanceState != nil && st.InstanceState.Name != "" {
					state = string(st.InstanceState.Name)
				}
				if err := e.check(aws.ToString(st.InstanceId), state, seen); err != nil {
					return err
				}
				a.InstanceStatuses = append(a.InstanceStatuses, st)
			}
			found = true
		case "nexttoken":
			// The CLI pages by itself; a token left in the output means a --max-items cut.
		default:
			return fmt.Errorf("%s: unknown key %q: want Images (aws ec2 describe-images), CapacityReservations (aws ec2 describe-capacity-reservations) or InstanceStatuses (aws ec2 describe-instance-status)", path, key)
		}
	}
	if !found {
		return fmt.Errorf("%s: no Images, CapacityReservations or InstanceStatuses", path)
	}
	return nil
}

// entry is one image or reservation as read, before it is decoded into EC2's type.
type entry struct {
	where string // file and position, for messages
	kind  ec2Kind
	body  []byte // JSON, with the short form's id renamed to EC2's field
}

// decodeEntries splits a list into entries, checking every field name against EC2's.
// key is the list's name as the file spells it (Images, images), for messages.
func decodeEntries(path, key string, kind ec2Kind, raw json.RawMessage) ([]entry, error) {
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s: %s: want a list of objects: %w", path, key, err)
	}
	out := make([]entry, 0, len(list))
	for i, fields := range list {
		where := fmt.Sprintf("%s: %s[%d]", path, key, i)
		for _, name := range sortedKeys(fields) {
			l := strings.ToLower(name)
			if l == "id" {
				if _, dup := fields[kind.idField]; dup {
					return nil, fmt.Errorf("%s: both id and %s", where, kind.idField)
				}
				fields[kind.idField] = fields[name]
				delete(fields, name)
				continue
			}
			if !kind.fields[l] {
				return nil, fmt.Errorf("%s: unknown field %q: EC2's %s has no such field (want id or %s, state, ... as EC2 names them)", where, name, strings.TrimSuffix(kind.key, "s"), kind.idField)
			}
		}
		body, err := json.Marshal(fields)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		out = append(out, entry{where: where, kind: kind, body: body})
	}
	return out, nil
}

func decodeEntry(e entry, v any) error {
	if err := json.Unmarshal(e.body, v); err != nil {
		return fmt.Errorf("%s: %w", e.where, err)
	}
	return nil
}

// check asks for the two fields the checks read, a state EC2 knows, and an ID listed once.
func (e entry) check(id, state string, seen map[string]string) error {
	if id == "" || state == "" {
		return fmt.Errorf("%s: needs an id (%s) and a state", e.where, e.kind.idField)
	}
	if !slices.Contains(e.kind.states, state) {
		return fmt.Errorf("%s (%s): state %q: EC2's states are %s", e.where, id, state, strings.Join(e.kind.states, ", "))
	}
	if prev, ok := seen[id]; ok {
		return fmt.Errorf("%s: %s is listed twice (also at %s)", e.where, id, prev)
	}
	seen[id] = e.where
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ec2Answers answers DescribeImages and DescribeCapacityReservations from an AWSFile, with
// EC2's own behaviour for unknown IDs (a NotFound error for the whole call), so that the
// checks run the same code as against EC2. It also counts the calls made.
type ec2Answers struct {
	file  *AWSFile
	calls map[string]int
}

func (a *ec2Answers) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	a.calls["DescribeImages"]++
	out := &ec2.DescribeImagesOutput{}
	for _, id := range in.ImageIds {
		i := slices.IndexFunc(a.file.Images, func(im ec2types.Image) bool { return aws.ToString(im.ImageId) == id })
		if i < 0 {
			return nil, &smithy.GenericAPIError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
		out.Images = append(out.Images, a.file.Images[i])
	}
	return out, nil
}

func (a *ec2Answers) DescribeCapacityReservations(_ context.Context, in *ec2.DescribeCapacityReservationsInput, _ ...func(*ec2.Options)) (*ec2.DescribeCapacityReservationsOutput, error) {
	a.calls["DescribeCapacityReservations"]++
	out := &ec2.DescribeCapacityReservationsOutput{}
	for _, id := range in.CapacityReservationIds {
		i := slices.IndexFunc(a.file.CapacityReservations, func(cr ec2types.CapacityReservation) bool {
			return aws.ToString(cr.CapacityReservationId) == id
		})
		if i < 0 {
			return nil, &smithy.GenericAPIError{Code: "InvalidCapacityReservationId.NotFound", Message: fmt.Sprintf("The capacity reservation ID '%s' does not exist", id)}
		}
		out.CapacityReservations = append(out.CapacityReservations, a.file.CapacityReservations[i])
	}
	return out, nil
}

// DescribeInstanceStatus answers from the file's instance statuses: the instances asked that
// it lists (EC2 answers nothing for an instance it does not report).
func (a *ec2Answers) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	a.calls["DescribeInstanceStatus"]++
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		for _, st := range a.file.InstanceStatuses {
			if aws.ToString(st.InstanceId) == id {
				out.InstanceStatuses = append(out.InstanceStatuses, st)
			}
		}
	}
	return out, nil
}

// ModifyInstanceEventStartTime is a what-if: it records the move the router would ask for,
// and moves nothing.
func (a *ec2Answers) ModifyInstanceEventStartTime(_ context.Context, in *ec2.ModifyInstanceEventStartTimeInput, _ ...func(*ec2.Options)) (*ec2.ModifyInstanceEventStartTimeOutput, error) {
	a.calls["ModifyInstanceEventStartTime"]++
	return &ec2.ModifyInstanceEventStartTimeOutput{Event: &ec2types.InstanceStatusEvent{InstanceEventId: in.InstanceEventId, NotBefore: in.NotBefore}}, nil
}
