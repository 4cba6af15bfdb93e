package kubetest

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// credentials say who a kubeconfig authenticates as: a client
// certificate or a bearer token.
type credentials struct {
	certPEM, keyPEM []byte
	token           string
}

// writeKubeconfig writes a kubeconfig for the API server at server,
// trusting caPEM, as creds, to path, and returns the client-go
// configuration it amounts to.
func writeKubeconfig(path, server string, caPEM []byte, creds credentials) (*rest.Config, error) {
	const name = "kubetest"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: creds.certPEM,
		ClientKeyData:         creds.keyPEM,
		Token:                 creds.token,
	}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return nil, fmt.Errorf("write the kubeconfig %s: %w", path, err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig %s: %w", path, err)
	}
	return rc, nil
}
