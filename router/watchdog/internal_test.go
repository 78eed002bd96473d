package watchdog

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestDeletionsBounded drops the oldest observations past maxDeletions.
func TestDeletionsBounded(t *testing.T) {
	d := newDeletions()
	t0 := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	for i := range maxDeletions + 5 {
		d.record(types.UID(fmt.Sprint(i)), "db", t0.Add(time.Duration(i)*time.Second))
	}
	if len(d.byUID) != maxDeletions {
		t.Fatalf("%d remembered, want %d", len(d.byUID), maxDeletions)
	}
	for i := range 5 {
		if _, ok := d.byUID[types.UID(fmt.Sprint(i))]; ok {
			t.Errorf("observation %d (among the oldest) kept", i)
		}
	}
	if _, ok := d.byUID[types.UID(fmt.Sprint(maxDeletions+4))]; !ok {
		t.Error("newest observation dropped")
	}
	// A second sighting keeps the first time.
	d.record("7", "db", t0.Add(time.Hour))
	if got := d.byUID["7"].at; !got.Equal(t0.Add(7 * time.Second)) {
		t.Errorf("re-recorded at %v", got)
	}
}

// slowEC2 blocks DescribeImages until released, counting calls.
type slowEC2 struct {
	calls   atomic.Int32
	release chan struct{}
}

func (s *slowEC2) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	s.calls.Add(1)
	<-s.release
	out := &ec2.DescribeImagesOutput{}
	for _, id := range in.ImageIds {
		out.Images = append(out.Images, ec2types.Image{ImageId: aws.String(id), State: ec2types.ImageStateAvailable})
	}
	return out, nil
}

// TestImageStatesCollapse makes one call for concurrent lookups of the same image set.
func TestImageStatesCollapse(t *testing.T) {
	api := &slowEC2{release: make(chan struct{})}
	s := newImageStates(api, clocktesting.NewFakeClock(time.Now()))
	var wg sync.WaitGroup
	results := make([]map[string]string, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = s.get(context.Background(), []string{"ami-b", "ami-a"})
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); api.calls.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the other lookups join the call in flight
	close(api.release)
	wg.Wait()
	if n := api.calls.Load(); n != 1 {
		t.Errorf("DescribeImages calls = %d, want 1", n)
	}
	for i, r := range results {
		if r["ami-a"] != "available" || r["ami-b"] != "available" {
			t.Errorf("lookup %d = %v", i, r)
		}
	}
}

// TestImageStatesBatches names at most describeBatch images per call.
func TestImageStatesBatches(t *testing.T) {
	api := &slowEC2{release: make(chan struct{})}
	close(api.release)
	s := newImageStates(api, clocktesting.NewFakeClock(time.Now()))
	var ids []string
	for i := range 2*describeBatch + 1 {
		ids = append(ids, fmt.Sprintf("ami-%05d", i))
	}
	got, err := s.get(context.Background(), ids)
	if err != nil || len(got) != len(ids) {
		t.Fatalf("got %d states, err %v", len(got), err)
	}
	if n := api.calls.Load(); n != 3 {
		t.Errorf("DescribeImages calls = %d, want 3", n)
	}
}
