// Package kube is Torpor's side of a Kubernetes cluster it runs on: node
// agents and routers join with their pod's projected ServiceAccount token,
// verified by the API server (TokenReview) against the workloads they must
// belong to (members.go); the cluster's Nodes drive Torpor's node
// lifecycle — cordon, drain, deletion (nodes.go); and the installation's
// CA is published in a ConfigMap that members verify the control plane
// with (ca.go). Only the control plane uses it; members merely read their
// token file.
package kube

import (
	"cmp"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/torpor-dev/torpor/internal/validate"
)

// Defaults of Config, matching deploy/kubernetes.
const (
	DefaultNamespace        = "torpor"
	DefaultNodeDaemonSet    = "torpor-node"
	DefaultRouterDeployment = "torpor-router"
	DefaultAudience         = "torpor.dev"
	DefaultCAConfigMap      = "torpor-ca"
)

// Config says which cluster and which of its workloads are Torpor's.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means the pod's in-cluster
	// configuration.
	Kubeconfig string
	// Namespace holds Torpor's workloads.
	Namespace string
	// NodeDaemonSet is the DaemonSet whose pods are node agents, and
	// RouterDeployment the Deployment whose pods are routers.
	NodeDaemonSet    string
	RouterDeployment string
	// Audience is what members' tokens must be issued for.
	Audience string
	// CAConfigMap is the ConfigMap the CA certificate is published in
	// (key ca.pem).
	CAConfigMap string
}

func (c Config) withDefaults() Config {
	c.Namespace = cmp.Or(c.Namespace, DefaultNamespace)
	c.NodeDaemonSet = cmp.Or(c.NodeDaemonSet, DefaultNodeDaemonSet)
	c.RouterDeployment = cmp.Or(c.RouterDeployment, DefaultRouterDeployment)
	c.Audience = cmp.Or(c.Audience, DefaultAudience)
	c.CAConfigMap = cmp.Or(c.CAConfigMap, DefaultCAConfigMap)
	return c
}

// Cluster is the control plane's view of the Kubernetes cluster.
type Cluster struct {
	client kubernetes.Interface
	cfg    Config
}

// Connect reaches the cluster cfg names.
func Connect(cfg Config) (*Cluster, error) {
	cfg = cfg.withDefaults()
	for _, f := range []struct{ flag, value string }{
		{"kubernetes-namespace", cfg.Namespace}, {"kubernetes-node-daemonset", cfg.NodeDaemonSet},
		{"kubernetes-router-deployment", cfg.RouterDeployment}, {"kubernetes-ca-configmap", cfg.CAConfigMap},
	} {
		if err := validate.Name(f.flag, f.value); err != nil {
			return nil, err
		}
	}
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: configuration (kubeconfig %q, empty for in-cluster): %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "torpor-server"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	return New(client, cfg), nil
}

// New is a Cluster over client.
func New(client kubernetes.Interface, cfg Config) *Cluster {
	return &Cluster{client: client, cfg: cfg.withDefaults()}
}

// Config is the cluster's configuration, defaults filled in.
func (c *Cluster) Config() Config { return c.cfg }
