#!/usr/bin/env bash
# Builds Envoy Gateway's egctl (its `experimental translate` command) from this module's go.mod/go.sum into $1
# (default: .cache/envoy-gateway/bin/egctl at the repository's root). No source is vendored: `go build` fetches the
# pinned modules from the Go module proxy into the shared module cache.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/.cache/envoy-gateway/bin/egctl}"
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
mkdir -p "$(dirname "$out")"
cd "$here"
version="$("$go" list -mod=readonly -m -f '{{.Version}}' github.com/envoyproxy/gateway)"
# -trimpath and no VCS stamp: the binary depends only on go.mod/go.sum and the Go release. The version variable is the
# one upstream's release build sets (internal/cmd/version), so `egctl version --remote=false` names the release.
"$go" build -mod=readonly -trimpath -buildvcs=false \
  -ldflags "-s -w -X github.com/envoyproxy/gateway/internal/cmd/version.envoyGatewayVersion=$version" \
  -o "$out.tmp" github.com/envoyproxy/gateway/cmd/egctl
mv "$out.tmp" "$out"
"$out" experimental translate --help >/dev/null
echo "built $out"
