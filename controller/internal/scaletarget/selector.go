package scaletarget

import (
	"fmt"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Selector is the label set of a /scale's status.selector, which must be
// equality only ("app=web,tier=front"): the target's private Service
// selects the same pods, and a Service's selector is a label set. An
// empty selector would select every pod of the namespace, so it is no
// selector here.
func Selector(s string) (map[string]string, error) {
	if s == "" {
		return nil, fmt.Errorf("its /scale reports no status.selector, so its pods cannot be found")
	}
	notSet := fmt.Errorf("its /scale selector %q is not equality only (want a=b,c=d): the private Service selects the same pods, and a Service's selector is a label set", s)
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("its /scale selector %q: %w", s, err)
	}
	reqs, _ := sel.Requirements()
	if len(reqs) == 0 {
		return nil, notSet
	}
	set := make(map[string]string, len(reqs))
	for _, r := range reqs {
		values := r.ValuesUnsorted()
		if op := r.Operator(); op != selection.Equals && op != selection.DoubleEquals || len(values) != 1 {
			return nil, notSet
		}
		if v, dup := set[r.Key()]; dup && v != values[0] {
			return nil, fmt.Errorf("its /scale selector %q wants label %s to be both %q and %q: it selects no pod", s, r.Key(), v, values[0])
		}
		set[r.Key()] = values[0]
	}
	return set, nil
}
