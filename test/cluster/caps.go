package cluster

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// capNumbers are the Linux capabilities by name (linux/capability.h).
var capNumbers = map[string]int{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
	"SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10,
	"NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15,
	"SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
	"SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30,
	"SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
	"BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

// defaultCaps is what containerd and Docker give a container that asks for
// nothing (containerd's oci.WithDefaultCapabilities... the 14 below).
var defaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
	"SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// lastCap is the kernel's highest capability number.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 40
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 40
	}
	return n
}

// containerCaps is the capability set a real runtime gives the container:
// privileged: all; else the default set, plus add, minus drop ("ALL" in
// drop empties the default set first, as in containerd).
func containerCaps(sc *corev1.SecurityContext) ([]int, error) {
	all := lastCap()
	var allCaps []int
	for i := 0; i <= all; i++ {
		allCaps = append(allCaps, i)
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		return allCaps, nil
	}
	set := map[int]bool{}
	for _, n := range defaultCaps {
		set[capNumbers[n]] = true
	}
	num := func(c corev1.Capability) (int, error) {
		name := strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
		n, ok := capNumbers[name]
		if !ok {
			return 0, fmt.Errorf("unknown capability %q", c)
		}
		return n, nil
	}
	if sc != nil && sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Drop {
			if strings.EqualFold(string(c), "ALL") {
				clear(set)
				continue
			}
			n, err := num(c)
			if err != nil {
				return nil, err
			}
			delete(set, n)
		}
		for _, c := range sc.Capabilities.Add {
			if strings.EqualFold(string(c), "ALL") {
				return allCaps, nil
			}
			n, err := num(c)
			if err != nil {
				return nil, err
			}
			set[n] = true
		}
	}
	var out []int
	for n := range set {
		if n <= all {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}
