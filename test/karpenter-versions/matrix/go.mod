module github.com/health-router/health-router/test/karpenter-versions/matrix

go 1.26.10
