//go:build tools

// The commands build.sh builds, imported so that `go mod tidy` keeps their modules (and go.sum their hashes).
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
