module github.com/health-router/health-router/test/karpenter-versions/v1_15

go 1.26.10

require (
	github.com/aws/karpenter-provider-aws v1.15.1
	github.com/health-router/health-router/test/karpenter-versions/matrix v0.0.0
)

require (
	github.com/samber/lo v1.53.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	k8s.io/apimachinery v0.37.0 // indirect
)

replace github.com/health-router/health-router/test/karpenter-versions/matrix => ../matrix
