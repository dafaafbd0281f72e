// Command pause is the pod sandbox's process for the local cluster's real
// node (containerd's sandbox image, test/cluster/realnode.go), built as the
// image "pause" with the project's other images, so the node pulls nothing
// from outside: it holds the pod's namespaces open by doing nothing until
// SIGTERM or SIGINT. As PID 1 of a pod that shares its PID namespace it also
// reaps the orphans re-parented to it, as Kubernetes' own pause does.
package main
