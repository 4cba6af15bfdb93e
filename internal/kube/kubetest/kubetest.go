// Package kubetest runs a real, minimal Kubernetes control plane on
// loopback for tests, as envtest does: etcd, kube-apiserver (TLS under a
// test CA, client-certificate and ServiceAccount-token authentication,
// Node and RBAC authorization) and kwok, which makes fake Nodes report
// Ready and the Pods bound to them Running. There is no kubelet,
// scheduler or controller manager: no ServiceAccount "default" is made and
// workload controllers make no Pods, so tests create the ServiceAccounts
// they name and Pods with spec.nodeName set.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// ServiceAccountIssuer is the issuer of the cluster's ServiceAccount
// tokens, the one Kubernetes clusters conventionally use; it is also the
// API server's audience.
const ServiceAccountIssuer = "https://kubernetes.default.svc"

// ServiceClusterIPRange is the range the API server allocates Service IPs
// from.
const ServiceClusterIPRange = "10.96.0.0/16"

// Cluster is a running test control plane. Stop, registered with
// t.Cleanup by Start, ends it.
type Cluster struct {
	// Kubeconfig is the path of a kubeconfig file of the cluster's admin
	// (a client certificate in group system:masters).
	Kubeconfig string
	// REST is the admin's client configuration.
	REST *rest.Config
	// ServiceAccountIssuer is the "iss" of the cluster's ServiceAccount
	// tokens.
	ServiceAccountIssuer string
	// Kubectl is the path of the kubectl binary built with the API server.
	Kubectl string

	t         testing.TB
	dir       string // every file of the cluster, removed by Stop
	pki       *pki
	clientset kubernetes.Interface
	spawner   *spawner
	procs     []*process // in start order
	files     int        // kubeconfigs written by KubeconfigFor
	mu        sync.Mutex // guards files
	stopOnce  sync.Once
}

// startTimeout bounds the start of all three programs; a cold start on a
// loaded 2-core machine takes a few seconds.
const startTimeout = 2 * time.Minute

// Start starts a test cluster from the binaries `make kube` builds into
// the module's bin/ (or the paths in TORPOR_ETCD, TORPOR_KUBE_APISERVER,
// TORPOR_KWOK and TORPOR_KUBECTL), returning once the API server is ready
// and kwok manages Nodes. It fails the test if any of them is missing or
// does not come up.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bins := findBinaries(t)
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{ServiceAccountIssuer: ServiceAccountIssuer, Kubectl: bins.kubectl, t: t, dir: dir, spawner: newSpawner()}
	t.Cleanup(c.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.start(ctx, bins); err != nil {
		t.Fatalf("start the test Kubernetes cluster (files in %s): %v", dir, err)
	}
	return c
}

type binaries struct{ etcd, apiserver, kwok, kubectl string }

// findBinaries locates the cluster's programs, failing the test with what
// to run when one is missing.
func findBinaries(t testing.TB) binaries {
	t.Helper()
	root, err := runtimetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	find := func(name, env string) string {
		if p := os.Getenv(env); p != "" {
			return p
		}
		p := filepath.Join(root, "bin", name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s not found at %s (%v): run `make kube`, or set %s", name, p, err, env)
		}
		return p
	}
	return binaries{
		etcd:      find("etcd", "TORPOR_ETCD"),
		apiserver: find("kube-apiserver", "TORPOR_KUBE_APISERVER"),
		kwok:      find("kwok", "TORPOR_KWOK"),
		kubectl:   find("kubectl", "TORPOR_KUBECTL"),
	}
}

func (c *Cluster) start(ctx context.Context, bins binaries) error {
	var err error
	if c.pki, err = newPKI(c.dir); err != nil {
		return err
	}
	stages, err := kwokStageFiles(bins.kwok, c.dir)
	if err != nil {
		return err
	}

	etcdPorts, err := c.serve(ctx, program{
		name: "etcd", bin: bins.etcd, ports: 2, client: plainHTTP,
		args: func(ports []string) []string {
			client, peer := "http://127.0.0.1:"+ports[0], "http://127.0.0.1:"+ports[1]
			return []string{
				"--name=kubetest",
				"--data-dir=" + filepath.Join(c.dir, "etcd"),
				"--listen-client-urls=" + client,
				"--advertise-client-urls=" + client,
				"--listen-peer-urls=" + peer,
				"--initial-advertise-peer-urls=" + peer,
				"--initial-cluster=kubetest=" + peer,
				"--unsafe-no-fsync", // the data is thrown away with the test
			}
		},
		health: func(ports []string) string { return "http://127.0.0.1:" + ports[0] + "/health" },
	})
	if err != nil {
		return err
	}

	admin := credentials{certPEM: c.pki.adminCertPEM, keyPEM: c.pki.adminKeyPEM}
	adminHTTP, err := rest.HTTPClientFor(&rest.Config{Timeout: probeTimeout, TLSClientConfig: rest.TLSClientConfig{
		CAData: c.pki.caPEM, CertData: admin.certPEM, KeyData: admin.keyPEM,
	}})
	if err != nil {
		return fmt.Errorf("the admin's client: %w", err)
	}
	apiPorts, err := c.serve(ctx, program{
		name: "kube-apiserver", bin: bins.apiserver, ports: 1, client: adminHTTP,
		args: func(ports []string) []string {
			return []string{
				"--etcd-servers=http://127.0.0.1:" + etcdPorts[0],
				"--bind-address=127.0.0.1",
				"--advertise-address=127.0.0.1",
				"--secure-port=" + ports[0],
				"--tls-cert-file=" + c.pki.servingCertFile,
				"--tls-private-key-file=" + c.pki.servingKeyFile,
				"--client-ca-file=" + c.pki.caFile,
				"--service-account-issuer=" + ServiceAccountIssuer,
				"--api-audiences=" + ServiceAccountIssuer,
				"--service-account-signing-key-file=" + c.pki.serviceAccountKeyFile,
				"--service-account-key-file=" + c.pki.serviceAccountKeyFile,
				"--authorization-mode=Node,RBAC",
				// As clusters that run node agents do: they are privileged pods.
				"--allow-privileged=true",
				"--service-cluster-ip-range=" + ServiceClusterIPRange,
				// Without it the API server keeps trying to publish its own
				// address as the endpoint of Service "kubernetes", and
				// validation refuses loopback addresses as endpoints.
				"--endpoint-reconciler-type=none",
				"--cert-dir=" + filepath.Join(c.dir, "apiserver"),
			}
		},
		health: func(ports []string) string { return "https://127.0.0.1:" + ports[0] + "/readyz" },
	})
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.dir, "admin.kubeconfig")
	if c.REST, err = writeKubeconfig(c.Kubeconfig, "https://127.0.0.1:"+apiPorts[0], c.pki.caPEM, admin); err != nil {
		return err
	}
	if c.clientset, err = kubernetes.NewForConfig(c.REST); err != nil {
		return fmt.Errorf("the admin's clientset: %w", err)
	}

	_, err = c.serve(ctx, program{
		name: "kwok", bin: bins.kwok, ports: 1, client: plainHTTP,
		// A HOME of its own: kwok also reads ~/.kwok/kwok.yaml.
		env: []string{"HOME=" + filepath.Join(c.dir, "kwok")},
		args: func(ports []string) []string {
			args := []string{
				"--kubeconfig=" + c.Kubeconfig,
				"--manage-all-nodes=true",
				// Its health endpoints, served once its controllers have
				// started.
				"--server-address=127.0.0.1:" + ports[0],
			}
			for _, s := range stages {
				args = append(args, "--config="+s)
			}
			return args
		},
		health: func(ports []string) string { return "http://127.0.0.1:" + ports[0] + "/healthz" },
	})
	return err
}

// program is one of the cluster's programs, as serve starts it.
type program struct {
	name, bin string
	env       []string
	ports     int // how many loopback ports it listens on
	args      func(ports []string) []string
	health    func(ports []string) string // a URL that answers 200 once it is up
	client    *http.Client                // for health
}

// portAttempts is how many times serve starts a program that keeps losing
// its ports.
const portAttempts = 3

// serve starts prog on fresh loopback ports and returns them once the
// program is healthy. A program that exits because another process took
// one of its ports between freePorts and its bind is started again on
// others. Each start is recorded for Stop, its log in the cluster's
// directory.
func (c *Cluster) serve(ctx context.Context, prog program) ([]string, error) {
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(prog.ports)
		if err != nil {
			return nil, err
		}
		logFile := filepath.Join(c.dir, prog.name+".log")
		if attempt > 1 {
			logFile = filepath.Join(c.dir, prog.name+"-"+strconv.Itoa(attempt)+".log")
		}
		p, err := c.spawner.startProcess(prog.name, logFile, prog.env, prog.bin, prog.args(ports)...)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
		err = p.waitHealthy(ctx, prog.client, prog.health(ports))
		var exited *exitError
		if errors.As(err, &exited) && exited.lostPort() && attempt < portAttempts {
			continue
		}
		return ports, err
	}
}

// Stop kills the cluster's programs (their process groups) and removes
// its files; on a failed test it logs the end of each program's output
// first. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop()
		}
		c.spawner.close()
		if c.t.Failed() {
			for _, p := range c.procs {
				c.t.Logf("%s's log ends:\n%s", p.name, p.logTail())
			}
		}
		if err := os.RemoveAll(c.dir); err != nil {
			c.t.Errorf("remove the test cluster's files: %v", err)
		}
	})
}

// Clientset is a client of the cluster as its admin.
func (c *Cluster) Clientset() kubernetes.Interface { return c.clientset }

// nodeReadyTimeout bounds how long kwok takes to make a new Node Ready.
const nodeReadyTimeout = time.Minute

// AddNode creates a Node with labels, which kwok manages, and returns it
// once it is Ready.
func (c *Cluster) AddNode(name string, labels map[string]string) *corev1.Node {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeReadyTimeout)
	defer cancel()
	nodes := c.clientset.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("create Node %s: %v", name, err)
	}
	var node *corev1.Node
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		node, err = nodes.Get(ctx, name, metav1.GetOptions{})
		return err == nil && nodeReady(node), nil
	})
	if err != nil {
		c.t.Fatalf("Node %s not Ready within %v (is kwok running? its log: %s): %v", name, nodeReadyTimeout, filepath.Join(c.dir, "kwok.log"), err)
	}
	return node
}

func nodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// KubeconfigFor writes a kubeconfig of the cluster that authenticates
// with the bearer token, for a component that runs as a ServiceAccount
// (under that account's RBAC), and returns its path.
func (c *Cluster) KubeconfigFor(token string) string {
	c.t.Helper()
	c.mu.Lock()
	c.files++
	path := filepath.Join(c.dir, "token-"+strconv.Itoa(c.files)+".kubeconfig")
	c.mu.Unlock()
	if _, err := writeKubeconfig(path, c.REST.Host, c.pki.caPEM, credentials{token: token}); err != nil {
		c.t.Fatal(err)
	}
	return path
}
