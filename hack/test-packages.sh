#!/usr/bin/env bash
# Prints the packages (./dir) whose tests include a function named by one of
# the prefixes given, e.g. `hack/test-packages.sh TestKernel TestProg`.
# The Makefile's privileged targets run exactly these packages, so a new
# privileged test is run by its target wherever it lives: no package list
# to forget. Prints nothing (and the target runs nothing) when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 PREFIX..." >&2; exit 2; }
alt=$(IFS='|'; echo "$*")
git ls-files -co --exclude-standard -- '*_test.go' ':!:hack/tools/**' |
	xargs -r grep -lE "^func (${alt})[A-Za-z0-9_]*\(" |
	xargs -r -n1 dirname | sort -u | sed 's|^|./|'
