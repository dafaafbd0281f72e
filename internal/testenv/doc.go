// Package testenv lets privileged tests say what they need: root, the
// cgroup v2 root, a bpffs; they skip with a reason, or fail under CI=true.
package testenv
