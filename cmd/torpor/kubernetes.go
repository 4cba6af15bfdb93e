package main

import (
	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor/internal/kube"
)

// kubeFlags make the control plane Kubernetes-native (torpor server
// --kubernetes): members join with their pods' ServiceAccount tokens, the
// cluster's Nodes drive the nodes' lifecycle (docs/deploy.md).
type kubeFlags struct {
	enabled bool
	cfg     kube.Config
}

func (f *kubeFlags) register(flags *pflag.FlagSet) {
	flags.BoolVar(&f.enabled, "kubernetes", false, "run on Kubernetes: node agents and routers join with their pods' ServiceAccount tokens (TokenReview), only the cluster's Nodes register as nodes, cordons, drains (taint "+kube.DrainTaint+") and deleted Nodes drive placement, and the CA is published in a ConfigMap")
	flags.StringVar(&f.cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default: the pod's in-cluster configuration)")
	flags.StringVar(&f.cfg.Namespace, "kubernetes-namespace", kube.DefaultNamespace, "namespace of Torpor's workloads")
	flags.StringVar(&f.cfg.NodeDaemonSet, "kubernetes-node-daemonset", kube.DefaultNodeDaemonSet, "DaemonSet whose pods are node agents")
	flags.StringVar(&f.cfg.RouterDeployment, "kubernetes-router-deployment", kube.DefaultRouterDeployment, "Deployment whose pods are routers")
	flags.StringVar(&f.cfg.Audience, "kubernetes-audience", kube.DefaultAudience, "audience members' ServiceAccount tokens must be issued for")
	flags.StringVar(&f.cfg.CAConfigMap, "kubernetes-ca-configmap", kube.DefaultCAConfigMap, "ConfigMap of the namespace the CA certificate is published in (key "+kube.CAKey+")")
}

// cluster connects to the cluster when --kubernetes is given.
func (f *kubeFlags) cluster() (*kube.Cluster, error) {
	if !f.enabled {
		return nil, nil
	}
	return kube.Connect(f.cfg)
}
