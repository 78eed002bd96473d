package intake

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/test/terraform/motoserver"
)

// motoAccount is the account moto_server answers GetCallerIdentity with.
const motoAccount = "123456789012"

// With --account and --region left empty (the defaults), the router takes the account from
// sts:GetCallerIdentity and the region from the SDK's configuration, and dead-letters events
// from elsewhere as foreign. Before, empty meant no check at all: an event of another account
// or region (a misrouted rule, a wrong dispatcher map) was acted on.
func TestOriginDefaultsToTheCallerAndTheSDKRegion(t *testing.T) {
	srv := motoserver.Start(t)
	ids := sts.NewFromConfig(srv.Config)
	ctx := context.Background()
	o, err := options.ParseRun([]string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	account, region, err := ResolveOrigin(ctx, ids, o.Account, o.Region, motoserver.Region)
	if err != nil {
		t.Fatalf("ResolveOrigin: %v", err)
	}
	if account != motoAccount || region != motoserver.Region {
		t.Errorf("origin = %q %q, want moto's account %s and the SDK's region %s", account, region, motoAccount, motoserver.Region)
	}

	for _, tc := range []struct {
		name            string
		account, region string // of the event
		reason          string // "" for accepted (it then reaches the pipeline, absent here)
	}{
		{"another account", "999999999999", motoserver.Region, "foreign"},
		{"another region", motoAccount, "eu-west-1", "foreign"},
	} {
		in, f, clk := newTestIntake(t)
		in.cfg.Account, in.cfg.Region = account, region
		body := `{"version":"0","id":"e1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"` + tc.account +
			`","time":"2026-11-21T10:00:00Z","region":"` + tc.region + `","resources":["arn:aws:ec2:` + tc.region + `:` + tc.account +
			`:instance/i-0123456789abcdef0"],"detail":{"instance-id":"i-0123456789abcdef0","instance-action":"terminate"}}`
		if err := in.handle(ctx, messageWithBody(clk.Now(), 1, body))(ctx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(f.sends) != 1 || aws.ToString(f.sends[0].MessageAttributes[AttrReason].StringValue) != tc.reason {
			t.Errorf("%s: dead letters %d (%v), want one with reason %s", tc.name, len(f.sends), f.sends, tc.reason)
		}
	}
}

func TestOriginExplicitAndOff(t *testing.T) {
	if options.OriginAny != OriginAny {
		t.Fatalf("options.OriginAny %q and intake.OriginAny %q differ", options.OriginAny, OriginAny)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name                               string
		account, region, sdkRegion         string
		wantAccount, wantRegion, wantError string
	}{
		{"both set", "111122223333", "eu-west-1", "us-east-1", "111122223333", "eu-west-1", ""},
		{"both off", OriginAny, OriginAny, "", "", "", ""},
		{"no region anywhere", "111122223333", "", "", "", "", "--region"},
		{"STS unreachable", "", "eu-west-1", "", "", "", "--account"},
	} {
		account, region, err := ResolveOrigin(ctx, failingSTS{}, tc.account, tc.region, tc.sdkRegion)
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.wantError)
			}
			continue
		}
		if err != nil || account != tc.wantAccount || region != tc.wantRegion {
			t.Errorf("%s: %q %q %v, want %q %q", tc.name, account, region, err, tc.wantAccount, tc.wantRegion)
		}
	}
}

type failingSTS struct{}

func (failingSTS) GetCallerIdentity(context.Context, *sts.GetCallerIdentityInput, ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error) {
	return nil, errors.New("no credentials")
}
