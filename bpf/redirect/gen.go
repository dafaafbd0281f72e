package redirect

// The object and its bindings are committed so `go build` needs no clang;
// `make verify` regenerates them (cd bpf && go generate ./... includes this
// package) and fails on a diff. Headers come from Debian's libbpf-dev and
// linux-libc-dev, found as bpf/gen.go finds them: <asm/types.h> lives in the
// multiarch include directory, which clang names for the machine it runs on.
//
//go:generate sh -c "go tool bpf2go -tags linux -target bpfel -type ip_addr -type svc_key -type svc_entry -type backend -type origin redirect redirect.c -- -O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/$(clang -print-multiarch)"
