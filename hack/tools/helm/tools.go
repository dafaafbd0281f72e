//go:build tools

// Package tools pins helm.sh/helm/v3 for `go build helm.sh/helm/v3/cmd/helm`
// (the chart's lint and template tests).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
