package config

import (
	"errors"
	"strings"
)

// PodSpec says which Revision pod-spec fields beyond the safe default a
// tenant may use: Knative's config-features keys (kubernetes.podspec-*,
// here without the "kubernetes." prefix, in the autoscaler ConfigMap).
// The controller does not deploy a Revision that uses a field whose key
// is disabled. Fields no key can enable (privileged containers, a
// procMount other than Default, host-process containers, volume kinds
// other than those below) the API server refuses at once (the CRDs' CEL
// rules).
type PodSpec struct {
	// VolumesEmptyDir allows emptyDir volumes (on by default, as in
	// Knative).
	VolumesEmptyDir bool
	// VolumesHostPath allows hostPath volumes: a node's files in a
	// tenant's pod.
	VolumesHostPath bool
	// PersistentVolumeClaim allows persistentVolumeClaim volumes.
	PersistentVolumeClaim bool
	// NodeSelector allows spec.nodeSelector: a tenant choosing nodes.
	NodeSelector bool
	// Tolerations allows spec.tolerations: a tenant on tainted nodes.
	Tolerations bool
	// SecurityContext allows the pod's and containers' securityContext
	// fields beyond the safe subset (docs/configuration.md, "Pod-spec fields"):
	// sysctls, seLinuxOptions, appArmorProfile, windowsOptions, an
	// Unconfined seccompProfile, ...
	SecurityContext bool
	// AddCapabilities allows containers to add capabilities other than
	// NET_BIND_SERVICE.
	AddCapabilities bool
}

// The pod-spec feature keys, as Knative names them in config-features
// without its "kubernetes." prefix.
const (
	KeyVolumesEmptyDir       = "podspec-volumes-emptydir"
	KeyVolumesHostPath       = "podspec-volumes-hostpath"
	KeyPersistentVolumeClaim = "podspec-persistent-volume-claim"
	KeyNodeSelector          = "podspec-nodeselector"
	KeyTolerations           = "podspec-tolerations"
	KeySecurityContext       = "podspec-securitycontext"
	KeyAddCapabilities       = "containerspec-addcapabilities"
)

// feature reads a pod-spec feature key: enabled or disabled, or Knative's
// allowed, which for pod-spec fields means enabled (Knative checks them
// as "not disabled").
func feature(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "enabled", "allowed":
		return true, nil
	case "disabled":
		return false, nil
	}
	return false, errors.New(`must be "enabled", "disabled" or "allowed" (the same as enabled)`)
}

// podSpecFields are the ConfigMap keys of PodSpec.
var podSpecFields = []field{
	{KeyVolumesEmptyDir, func(c *Config, v string) (err error) {
		c.PodSpec.VolumesEmptyDir, err = feature(v)
		return err
	}},
	{KeyVolumesHostPath, func(c *Config, v string) (err error) {
		c.PodSpec.VolumesHostPath, err = feature(v)
		return err
	}},
	{KeyPersistentVolumeClaim, func(c *Config, v string) (err error) {
		c.PodSpec.PersistentVolumeClaim, err = feature(v)
		return err
	}},
	{KeyNodeSelector, func(c *Config, v string) (err error) {
		c.PodSpec.NodeSelector, err = feature(v)
		return err
	}},
	{KeyTolerations, func(c *Config, v string) (err error) {
		c.PodSpec.Tolerations, err = feature(v)
		return err
	}},
	{KeySecurityContext, func(c *Config, v string) (err error) {
		c.PodSpec.SecurityContext, err = feature(v)
		return err
	}},
	{KeyAddCapabilities, func(c *Config, v string) (err error) {
		c.PodSpec.AddCapabilities, err = feature(v)
		return err
	}},
}
