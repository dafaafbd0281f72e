// Package scaletarget is what a PodAutoscaler's scaleTargetRef may name and
// how a target of any kind is read and scaled: through its /scale
// subresource, whose status.selector finds its pods.
package scaletarget
