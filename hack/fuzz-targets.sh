#!/usr/bin/env bash
# Prints every Go fuzz target as "./package FuzzName", one a line, sorted:
# each func Fuzz... in a *_test.go file, except FuzzProg* (BPF_PROG_TEST_RUN
# needs root and the kernel: test-bpf runs those). `make test-fuzz` runs
# exactly these, so a new fuzz target cannot be missed.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -co --exclude-standard -- '*_test.go' ':!:hack/tools/**' |
	xargs -r grep -HoE '^func Fuzz[A-Za-z0-9_]*\(' |
	sed -E 's|^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($|./\1 \2|' |
	grep -v ' FuzzProg' | sort -u
