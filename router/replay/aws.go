package replay

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"sigs.k8s.io/yaml"
)

// AWSFile is the --aws file: what EC2 would answer the pre-signal checks.
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
//	    totalInstanceCount: 4
//	    availableInstanceCount: 1
//
// An image or reservation not listed does not exist, as EC2 would say.
type AWSFile struct {
	Images []struct {
		ID           string `json:"id"`
		Name         string `json:"name,omitempty"`
		State        string `json:"state"`
		Architecture string `json:"architecture,omitempty"`
	} `json:"images"`
	CapacityReservations []struct {
		ID                     string `json:"id"`
		State                  string `json:"state"`
		InstanceType           string `json:"instanceType,omitempty"`
		TotalInstanceCount     int32  `json:"totalInstanceCount"`
		AvailableInstanceCount int32  `json:"availableInstanceCount"`
	} `json:"capacityReservations"`
}

// LoadAWSFile reads an --aws file.
func LoadAWSFile(path string) (*AWSFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	var a AWSFile
	if err := yaml.UnmarshalStrict(b, &a); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, im := range a.Images {
		if im.ID == "" || im.State == "" {
			return nil, fmt.Errorf("%s: every image needs an id and a state", path)
		}
	}
	for _, cr := range a.CapacityReservations {
		if cr.ID == "" || cr.State == "" {
			return nil, fmt.Errorf("%s: every capacity reservation needs an id and a state", path)
		}
	}
	return &a, nil
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
		found := false
		for _, im := range a.file.Images {
			if im.ID == id {
				found = true
				out.Images = append(out.Images, ec2types.Image{ImageId: aws.String(im.ID), Name: aws.String(im.Name), State: ec2types.ImageState(im.State), Architecture: ec2types.ArchitectureValues(im.Architecture)})
			}
		}
		if !found {
			return nil, &smithy.GenericAPIError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
	}
	return out, nil
}

func (a *ec2Answers) DescribeCapacityReservations(_ context.Context, in *ec2.DescribeCapacityReservationsInput, _ ...func(*ec2.Options)) (*ec2.DescribeCapacityReservationsOutput, error) {
	a.calls["DescribeCapacityReservations"]++
	out := &ec2.DescribeCapacityReservationsOutput{}
	for _, id := range in.CapacityReservationIds {
		found := false
		for _, cr := range a.file.CapacityReservations {
			if cr.ID == id {
				found = true
				out.CapacityReservations = append(out.CapacityReservations, ec2types.CapacityReservation{
					CapacityReservationId: aws.String(cr.ID), State: ec2types.CapacityReservationState(cr.State),
					InstanceType: aws.String(cr.InstanceType), TotalInstanceCount: aws.Int32(cr.TotalInstanceCount),
					AvailableInstanceCount: aws.Int32(cr.AvailableInstanceCount),
				})
			}
		}
		if !found {
			return nil, &smithy.GenericAPIError{Code: "InvalidCapacityReservationId.NotFound", Message: fmt.Sprintf("The capacity reservation ID '%s' does not exist", id)}
		}
	}
	return out, nil
}
