package podwatch

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// ReasonActivatorSetRefused is the reason of the Event recorded when the
// kernel refuses the activator set.
const ReasonActivatorSetRefused = "ActivatorSetRefused"

// RefusalEvents records a Kubernetes Event (Warning, ActivatorSetRefused)
// when the kernel refuses the set of activators, so that `kubectl
// describe` of the agent's pod and event watchers see what the log and
// sockscale_agent_activator_set_failures_total say. One Event per distinct
// refusal: the set is written again at every change of any activator pod,
// and the same refusal repeated would flood the namespace's Events; a set
// the kernel takes clears it, so the next refusal is recorded again.
// Methods run under WatchActivators' lock; a nil *RefusalEvents records
// nothing.
type RefusalEvents struct {
	Recorder events.EventRecorder
	// Regarding is the object the Events are about: the agent's Pod. It
	// is called when the first Event is due (the pod's UID, which
	// `kubectl describe` matches Events by, needs a read).
	Regarding func() runtime.Object
	// Limit is the most addresses the kernel's set holds (bpf.MaxActivators).
	Limit int

	regarding runtime.Object
	// last is the size of the set last refused with an Event; 0: none
	// since the kernel last took a set.
	last int
}

// refused records an Event unless the kernel refused a set of n
// addresses before without taking one since.
func (r *RefusalEvents) refused(n int, err error) {
	if r == nil || n == r.last {
		return
	}
	r.last = n
	if r.regarding == nil {
		r.regarding = r.Regarding()
	}
	r.Recorder.Eventf(r.regarding, nil, "Warning", ReasonActivatorSetRefused, "SetActivators",
		"the kernel refused the set of %d activator addresses (it holds at most %d) and keeps its previous set: requests from the activators missing from it count as load (%v)",
		n, r.Limit, err)
}

// accepted notes that the kernel took a set.
func (r *RefusalEvents) accepted() {
	if r != nil {
		r.last = 0
	}
}
