//go:build tools

// One package of each module whose CRD files the tests install, imported so that `go mod tidy` keeps the module
// required (and go.sum its hash): Gateway API's standard channel (config/crd/standard), the Prometheus operator's
// PodMonitor (example/prometheus-operator-crd) and Kubeflow Training's TFJob (manifests/base/crds).
package crds

import (
	_ "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	_ "github.com/prometheus-operator/prometheus-operator/pkg/versionutil"
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
