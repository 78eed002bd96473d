module github.com/health-router/health-router/test/karpenter-versions/v1_10

go 1.26.10

require (
	github.com/aws/karpenter-provider-aws v1.10.0
	github.com/health-router/health-router/test/karpenter-versions/matrix v0.0.0
)

require (
	github.com/samber/lo v1.52.0 // indirect
	golang.org/x/text v0.34.0 // indirect
	k8s.io/apimachinery v0.35.3 // indirect
)

replace github.com/health-router/health-router/test/karpenter-versions/matrix => ../matrix
