package bpf

// The objects and bindings are committed so `go build` needs no clang;
// `make verify` regenerates them and fails on a diff. Headers come from
// Debian's libbpf-dev and linux-libc-dev (the multiarch include is where
// <asm/types.h> lives).
//go:generate go tool bpf2go -tags linux -target bpfel -type pod_stats -type conn_key -type conn accounting accounting.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu
