//go:build tools

// Package tools pins the upstream kubelet of real nodes (NODE_KIND=kubelet); nothing here is
// compiled into noops. Its own module, so that adding it leaves the control plane's cache key
// alone; hack/build-upstream.sh refuses a Kubernetes version other than tools/k8s's.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
