package main

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/sockscale/sockscale/test/cluster"
)

// forgetPodAddresses flushes the neighbour (ARP) entries of the cluster
// range on the host and in every pod's network namespace.
//
// Why: the node simulator gives a freed pod address to the next pod at
// once and announces nothing, so a scale from zero reuses the addresses of
// the pods that just went, and the host and the activators keep sending to
// the old pods' MAC addresses until their entries fail (about 8 s); the
// cold start would measure those caches, and requests forwarded meanwhile
// fail (dial timeout, 502). Real CNI plugins rotate and announce
// addresses. test/e2e does the same; remove both once test/cluster does.
func forgetPodAddresses() error {
	if out, err := exec.Command("ip", "neigh", "flush", "to", cluster.ClusterCIDR.String()).CombinedOutput(); err != nil {
		return fmt.Errorf("ip neigh flush to %s: %w: %s", cluster.ClusterCIDR, err, out)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], cluster.Prefix+"-") {
			// A namespace may go between the list and the flush.
			_ = exec.Command("ip", "-n", f[0], "neigh", "flush", "all").Run()
		}
	}
	return nil
}
