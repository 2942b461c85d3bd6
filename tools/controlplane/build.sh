#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from the pinned modules of go.mod/go.sum into OUT/bin (OUT:
# .cache/controlplane at the repository root by default) and copies the CRDs the manifests use from the pinned modules
# of crds/go.mod/crds/go.sum, and the flink-kubernetes-operator's from the Maven artifact crds/pom.xml pins, into
# OUT/crds, for tests/k8s/controlplane.py. Skipped when OUT's stamp matches the go.mod, go.sum, pom.xml files and
# this script. The Go build and module caches make a rebuild after a version bump incremental.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:-$HERE/../../.cache/controlplane}" && cd "${1:-$HERE/../../.cache/controlplane}" && pwd)
GO=$(command -v go || echo /usr/local/go/bin/go)
command -v mvn >/dev/null || { echo "mvn not found: the Flink operator's CRD comes from Maven Central; install Maven (Debian: apt-get install -y maven openjdk-17-jre-headless)." >&2; exit 1; }
[ -x "$GO" ] || { echo "go not found: the test control plane is built from source; install Go 1.24+ (https://go.dev/dl) or put it on PATH." >&2; exit 1; }
cd "$HERE"
stamp=$(cat go.mod go.sum crds/go.mod crds/go.sum crds/pom.xml build.sh | sha256sum | cut -d' ' -f1)
if [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$stamp" ] \
    && [ -x "$OUT/bin/kube-apiserver" ] && [ -x "$OUT/bin/kube-controller-manager" ] && [ -x "$OUT/bin/etcd" ]; then
  exit 0
fi
rm -f "$OUT/.stamp"
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' go.mod)
minor=$(echo "$k8s_version" | cut -d. -f2)
# What /version reports (kubectl compares it with its own); Kubernetes' release build sets the same variables.
version_flags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1"
version_flags="$version_flags -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
echo "building the test control plane (kube-apiserver, kube-controller-manager $k8s_version, etcd) into $OUT" >&2
"$GO" build -mod=readonly -trimpath -ldflags "-s -w $version_flags" -o "$OUT/bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
"$GO" build -mod=readonly -trimpath -ldflags "-s -w $version_flags" -o "$OUT/bin/kube-controller-manager" \
  k8s.io/kubernetes/cmd/kube-controller-manager
"$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT/bin/etcd" go.etcd.io/etcd/server/v3
# Each module's Dir in the module cache, downloaded and checked against crds/go.sum by `go mod download`.
module_dir() { (cd crds && "$GO" mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }
rm -rf "$OUT/crds" && mkdir -p "$OUT/crds"
gateway_api=$(module_dir sigs.k8s.io/gateway-api)
prometheus_operator=$(module_dir github.com/prometheus-operator/prometheus-operator)
training_operator=$(module_dir github.com/kubeflow/training-operator)
cp "$gateway_api"/config/crd/standard/*.yaml "$OUT/crds/"
cp "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" "$OUT/crds/"
cp "$training_operator/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$OUT/crds/"
# The flink-kubernetes-operator's FlinkDeployment CRD, unpacked from its API jar (Maven's local repository caches it).
unpacked=$(mktemp -d)
mvn -B -q -f crds/pom.xml dependency:unpack -Dcrds.out="$unpacked"
cp "$unpacked/META-INF/fabric8/flinkdeployments.flink.apache.org-v1.yml" "$OUT/crds/flinkdeployments.flink.apache.org.yaml"
rm -rf "$unpacked"
chmod u+w "$OUT"/crds/*.yaml
echo "$stamp" > "$OUT/.stamp"
