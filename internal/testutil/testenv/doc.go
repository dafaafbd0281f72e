// Package testenv lets privileged tests say what they need: root, a bpffs,
// the control plane; they skip with a reason, or fail under CI=true.
package testenv
