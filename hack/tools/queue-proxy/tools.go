//go:build tools

// Package tools pins knative.dev/serving for `go build knative.dev/serving/cmd/queue`.
package tools

import _ "knative.dev/serving/cmd/queue"
