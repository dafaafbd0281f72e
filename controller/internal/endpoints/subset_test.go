package endpoints

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSubsetIsStableAndSpread(t *testing.T) {
	acts := []string{"act-a", "act-b", "act-c", "act-d", "act-e"}
	if diff := cmp.Diff(Subset("ns/hello", acts, 2), Subset("ns/hello", []string{"act-e", "act-d", "act-c", "act-b", "act-a"}, 2)); diff != "" {
		t.Errorf("order of activators changed the subset (-first +second):\n%s", diff)
	}
	counts := map[string]int{}
	for i := range 1000 {
		for _, a := range Subset(fmt.Sprintf("ns/t-%d", i), acts, 2) {
			counts[a]++
		}
	}
	for _, a := range acts {
		if counts[a] < 300 || counts[a] > 500 { // 400 each on average
			t.Errorf("activator %s serves %d of 1000 targets' 2 slots, want about 400", a, counts[a])
		}
	}
	// Removing an activator moves only the targets that had it.
	moved := 0
	for i := range 1000 {
		before := Subset(fmt.Sprintf("ns/t-%d", i), acts, 2)
		after := Subset(fmt.Sprintf("ns/t-%d", i), acts[:4], 2)
		if !cmp.Equal(before, after) && !contains(before, "act-e") {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d targets without act-e changed subset when act-e left", moved)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
