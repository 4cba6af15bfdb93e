package kube

import (
	"bytes"
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CAKey is the key of the CA certificate (PEM) in the CA ConfigMap.
const CAKey = "ca.pem"

// PublishCA writes the installation's CA certificate into the CA
// ConfigMap of the namespace, where node agents and routers mount it to
// verify the control plane before they join (as kube-root-ca.crt is
// published for the API server's). It changes nothing when the ConfigMap
// already holds it.
func (c *Cluster) PublishCA(ctx context.Context, caPEM []byte) error {
	cms := c.client.CoreV1().ConfigMaps(c.cfg.Namespace)
	cur, err := cms.Get(ctx, c.cfg.CAConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: c.cfg.CAConfigMap, Namespace: c.cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "torpor"}},
			Data:       map[string]string{CAKey: string(caPEM)},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return c.PublishCA(ctx, caPEM)
		}
	} else if err == nil && !bytes.Equal([]byte(cur.Data[CAKey]), caPEM) {
		cur.Data = map[string]string{CAKey: string(caPEM)}
		_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return unavailable("publish the CA in ConfigMap "+c.cfg.Namespace+"/"+c.cfg.CAConfigMap, err)
	}
	return nil
}
