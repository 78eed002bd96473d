package options

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
)

// ErrNoCluster: there is no cluster to talk to, neither a kubeconfig (--kubeconfig,
// $KUBECONFIG, ~/.kube/config) nor the Pod's own service account. Outside a cluster that is
// a mistake of the caller's, told in one line; doctor runs its checks that need no cluster.
var ErrNoCluster = errors.New("no cluster to talk to: no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not in a Pod")

// kubeFlags defines the flags a command that talks to the cluster shares with kubectl and its
// plugins (k8s.io/cli-runtime's ConfigFlags): --kubeconfig, --context and -n/--namespace,
// bound to kubeconfig, kubeContext and namespace. namespace keeps its default and gets its own
// text: it is the router's namespace, not the kubeconfig context's.
func kubeFlags(fs *pflag.FlagSet, kubeconfig, kubeContext, namespace *string, namespaceUsage string) {
	(&genericclioptions.ConfigFlags{KubeConfig: kubeconfig, Context: kubeContext, Namespace: namespace}).AddFlags(fs)
	fs.Lookup("kubeconfig").Usage = "kubeconfig `path` (default: $KUBECONFIG, else ~/.kube/config, else the Pod's service account)"
	fs.Lookup("context").Usage = "kubeconfig `context` to use (default: the kubeconfig's current context)"
	fs.Lookup("namespace").Usage = namespaceUsage
}

// RESTConfig finds the cluster as kubectl does: the kubeconfig at kubeconfig (else
// $KUBECONFIG, else ~/.kube/config) and its context kubeContext (else its current one), and
// in a Pod with none of them, the Pod's service account. With none of these it returns
// ErrNoCluster, where client-go's loader would make up http://localhost:8080.
func RESTConfig(kubeconfig, kubeContext string) (*rest.Config, error) {
	flags := &genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Context: &kubeContext}
	raw, err := flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		if kubeconfig != "" {
			return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
		}
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	if len(raw.Clusters) == 0 {
		// No kubeconfig: the Pod's service account, or nothing (client-go's loader would go on
		// to a default of its own, http://localhost:8080, and a refused connection later).
		if kubeContext != "" {
			return nil, fmt.Errorf("--context %s: %w", kubeContext, ErrNoCluster)
		}
		cfg, err := rest.InClusterConfig()
		switch {
		case errors.Is(err, rest.ErrNotInCluster):
			return nil, ErrNoCluster
		case err != nil:
			return nil, fmt.Errorf("reading the Pod's service account: %w", err)
		}
		return cfg, nil
	}
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		if kubeContext != "" {
			return nil, fmt.Errorf("--context %s: %w", kubeContext, err)
		}
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	return cfg, nil
}
