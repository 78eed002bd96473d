# Sourced by the scripts that build Kubernetes binaries (envtest-bins.sh, world-bins.sh):
# k8s_modfile DIR NAME copies this repository's go.mod and go.sum to DIR/NAME.mod and
# DIR/NAME.sum and pins every staging module to the release of K8S_VERSION, as
# k8s.io/kubernetes requires (its go.mod replaces them with ./staging directories, which a
# module build cannot see). Built inside the repository's own module graph, every package a
# Kubernetes binary shares with the router (client-go, apimachinery, the API types, grpc,
# protobuf) is the version the router is compiled against, and with make's flags (cgo off,
# -trimpath) the build cache already holds it from `go vet` and the tests.
k8s_staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
  cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
  kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)

k8s_modfile() {
  local dir=$1 name=$2 root m
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cp "$root/go.mod" "$dir/$name.mod"
  cp "$root/go.sum" "$dir/$name.sum"
  for m in "${k8s_staging[@]}"; do echo "replace k8s.io/$m => k8s.io/$m v0.${K8S_VERSION#1.}" >>"$dir/$name.mod"; done
}
