//go:build tools

// Package tools pins Envoy Gateway's egctl (its `experimental translate` turns Gateway API objects into Envoy
// configuration); build.sh builds it from this module's go.mod/go.sum.
package tools

import (
	_ "github.com/envoyproxy/gateway/cmd/egctl"
)
