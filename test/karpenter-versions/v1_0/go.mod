module github.com/health-router/health-router/test/karpenter-versions/v1_0

go 1.26.10

require (
	github.com/aws/karpenter-provider-aws v1.0.8
	github.com/health-router/health-router/test/karpenter-versions/matrix v0.0.0
)

require (
	github.com/samber/lo v1.46.0 // indirect
	golang.org/x/text v0.17.0 // indirect
	k8s.io/apimachinery v0.30.3 // indirect
)

replace github.com/health-router/health-router/test/karpenter-versions/matrix => ../matrix
