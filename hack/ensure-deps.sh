#!/usr/bin/env bash
# Installs the Debian packages the build and tests need, only when missing, so
# `make test` and `make demo` work on a brand-new machine. Idempotent.
set -euo pipefail

# command -> Debian package that provides it
declare -A pkgs=(
  [clang]=clang
  [llvm-strip]=llvm
  [bpftool]=bpftool
  [ip]=iproute2
  [iptables]=iptables
  [conntrack]=conntrack
  [runc]=runc
)
missing=()
for cmd in "${!pkgs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkgs[$cmd]}")
done
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -f /usr/include/linux/bpf.h ] || missing+=(linux-libc-dev)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-deps: missing packages: ${missing[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "ensure-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
