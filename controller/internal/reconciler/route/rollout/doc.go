// Package rollout moves a Route's traffic to a configuration's new latest
// ready Revision gradually over rollout-duration, step by step as Knative
// Serving does, as a pure function of the previous state, the goal and now.
package rollout
