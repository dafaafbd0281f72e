package bpf

// The objects and bindings are committed so `go build` needs no clang;
// `make verify` regenerates them and fails on a diff. Headers come from
// Debian's libbpf-dev and linux-libc-dev; <asm/types.h> lives in the
// multiarch include directory (x86_64-linux-gnu, aarch64-linux-gnu, ...),
// which clang names for the machine it runs on (clang -print-multiarch), so
// the same line works on any Debian build machine; the objects are -target
// bpfel whatever the machine.
//
// Two objects from the one source (accounting.c says how it is laid out):
//   - accounting, the production object the agent loads (New).
//   - accountingtest, with -DSOCKSCALE_TEST_TUPLE: the packet programs find
//     connections by four-tuple in a map the tests fill, because
//     BPF_PROG_TEST_RUN gives every run a new socket (lib/conn.h). Its
//     bindings are a _test.go file (-output-suffix _test), so only the test
//     binary embeds it. The tests use the production object's Go types for
//     the structs both share (-no-global-types) and accountingtestConnKey
//     for the key of the map only this object has.
//
//go:generate sh -c "go tool bpf2go -tags linux -target bpfel -type pod_stats -type conn -type msg -type learned_conn -type conn_adjust -type h2_conn -type ip_addr accounting accounting.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/$(clang -print-multiarch)"
//go:generate sh -c "go tool bpf2go -tags linux -target bpfel -no-global-types -type conn_key -type drop_rule -output-suffix _test accountingtest accounting.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/$(clang -print-multiarch) -DSOCKSCALE_TEST_TUPLE"
