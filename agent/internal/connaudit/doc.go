// Package connaudit checks each pod's open-connection count against the
// kernel's socket table, the ground truth, and corrects it: connections the
// BPF programs never saw (opened before the agent or before the pod was
// added, idle since) are learned at once, and what the two disagreed on is
// exported per pod.
package connaudit
