#!/usr/bin/env bash
# Build (or reuse) versitygw, the Versity S3 Gateway (Apache-2.0, Go): the real S3 server of the
# tests and benchmarks. One `go install` of the released module, cached by version under
# ~/.cache/resource-functions/versitygw-<version>/bin (about a minute the first time; a second
# run is free). Prints the path of the binary.
#
#   testbed/build_versitygw.sh
#   VERSITYGW_VERSION=v1.8.0 testbed/build_versitygw.sh
set -euo pipefail

version="${VERSITYGW_VERSION:-v1.8.0}"
cache="${RF_CACHE:-$HOME/.cache/resource-functions}/versitygw-$version"
out="$cache/bin"
binary="$out/versitygw"

if [ -x "$binary" ] && [ -f "$out/.complete" ]; then echo "$binary"; exit 0; fi
command -v go >/dev/null || { echo "build_versitygw.sh: go is not installed" >&2; exit 1; }
mkdir -p "$out"
# One build at a time; a caller that waited finds the binary made by the other.
exec 9>"$cache/build.lock"
flock 9
if [ -x "$binary" ] && [ -f "$out/.complete" ]; then echo "$binary"; exit 0; fi

start=$(date +%s)
echo "build_versitygw.sh: building versitygw $version" >&2
CGO_ENABLED=0 GOBIN="$out" GOFLAGS=-mod=mod GOMAXPROCS="${GOMAXPROCS:-2}" \
  go install -trimpath -ldflags='-s -w' "github.com/versity/versitygw/cmd/versitygw@$version" >&2
touch "$out/.complete"
echo "build_versitygw.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$binary"
