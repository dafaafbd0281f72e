// Command bench measures sockscale's data path, accounting and connect-time
// redirect on this machine and prints comparable tables: every ratio is
// measured side by side in one run, modes taking turns in short slices,
// because shared machines are noisy.
//
//	go run ./test/bench [-slice 250ms] [-rounds 120] [-block 10] [-c 1,16,64] [-families ipv4,ipv6] [-queue-proxy PATH]
//	    [-h2-rounds 60] [-h2-block 5] [-h2-protocols h2c,grpc]
//	    [-activator PATH] [-activator-rounds 30] [-activator-block 5] [-cc-c 8,16] [-cc-rounds 10] [-cc-slice 2s]
//	    [-cold-starts 30] [-cold-probe-periods 25ms,15ms] [-held 10000]
//	    [-connect-rounds 40] [-connect-block 5]
//	    [-split-connects 20000]
//	    [-only datapath,accuracy,h2,h2-accuracy,footprint,activator,cc,coldstart,hold,connect,split]
//
// The controller at scale is a command of its own, test/bench/scale.
//
// It needs root (network namespaces, cgroups, BPF). Traffic goes only to
// the fake pods it creates in network namespaces on this machine, and to a
// loopback address the connect part's redirect rewrites to a pod.
package main
