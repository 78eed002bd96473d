package intake

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// OriginAny, as --account or --region, switches that half of the origin check off.
const OriginAny = "any"

// identityAPI is the part of STS the intake uses: GetCallerIdentity, which needs no IAM
// permission.
type identityAPI interface {
	GetCallerIdentity(context.Context, *sts.GetCallerIdentityInput, ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
}

// ResolveOrigin returns the account and region the intake accepts events from (Config.Account
// and Region; "" accepts any). An empty account is the caller's own, from
// sts:GetCallerIdentity; an empty region is the SDK's (sdkRegion); OriginAny switches the
// check off. The check guards against a misconfiguration (a rule or dispatcher feeding this
// cluster's queue from another account or region); it is not authentication: whoever may send
// to the queue may write any account into a body. It fails rather than leave the check off
// unasked: without an identity or a region the router's AWS calls would fail anyway.
func ResolveOrigin(ctx context.Context, ids identityAPI, account, region, sdkRegion string) (string, string, error) {
	switch account {
	case OriginAny:
		account = ""
	case "":
		out, err := ids.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		if err != nil {
			return "", "", fmt.Errorf("finding the router's account with sts:GetCallerIdentity (set --account, or --account=%s to accept events of any account): %w", OriginAny, err)
		}
		account = aws.ToString(out.Account)
	}
	switch region {
	case OriginAny:
		region = ""
	case "":
		if sdkRegion == "" {
			return "", "", fmt.Errorf("no AWS region: set --region or AWS_REGION (or --region=%s to accept events of any region)", OriginAny)
		}
		region = sdkRegion
	}
	return account, region, nil
}
