#!/usr/bin/env bash
# Build kube-network-policies (sigs.k8s.io/kube-network-policies, the NetworkPolicy enforcer
# that kind uses) from the Go module proxy, once, cached by version. The test cluster runs it
# only for the tests that turn enforcement on (testbed/kubernetes/network_policies.py).
# Prints one line: kube-network-policies=DIR. About 6 minutes on 2 cores the first time.
#
#   testbed/kubernetes/build_network_policies.sh
set -euo pipefail
version=v0.8.0
cache="${RF_CLUSTER_CACHE:-$HOME/.cache/resource-functions}/kube-network-policies-$version"
out="$cache/bin"
if [ -f "$out/.complete" ]; then echo "kube-network-policies=$out"; exit 0; fi

command -v go >/dev/null || { echo "build_network_policies.sh: go is not installed" >&2; exit 1; }
mkdir -p "$cache"
# One build at a time; a caller that waited finds the binary made by the other.
exec 9>"$cache/build.lock"
flock 9
if [ ! -f "$out/.complete" ]; then
  echo "build_network_policies.sh: building kube-network-policies $version" >&2
  start=$(date +%s)
  rm -rf "$cache/gobin" && mkdir -p "$cache/gobin" "$out"
  # The main package is .../cmd, so go install names the binary "cmd".
  CGO_ENABLED=0 GOMAXPROCS="${GOMAXPROCS:-2}" GOBIN="$cache/gobin" GOFLAGS=-mod=mod \
    go install -trimpath -ldflags="-s -w" "sigs.k8s.io/kube-network-policies/cmd@$version" >&2
  mv "$cache/gobin/cmd" "$out/kube-network-policies"
  rm -rf "$cache/gobin"
  touch "$out/.complete"
  echo "build_network_policies.sh: built in $(( $(date +%s) - start ))s" >&2
fi
echo "kube-network-policies=$out"
