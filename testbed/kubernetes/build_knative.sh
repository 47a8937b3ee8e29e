#!/usr/bin/env bash
# Build what the test cluster needs to run Knative, once, cached by release:
#   - Knative Eventing and Serving components, from the release sources with their vendor/
#     folders in ../shared/third_party (their Go modules are not served here), as static binaries;
#   - CoreDNS (cluster DNS), from the Go module proxy;
#   - the test-only KIngress proxy of testbed/kubernetes/kingress/.
# Prints one line per piece: NAME=DIR. About 12 minutes on 2 cores the first time, then free.
#
#   testbed/kubernetes/build_knative.sh
#   RF_THIRD_PARTY=/path/to/third_party testbed/kubernetes/build_knative.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
third_party="${RF_THIRD_PARTY:-$here/../../../shared/third_party}"
cache="${RF_CLUSTER_CACHE:-$HOME/.cache/resource-functions}/knative"
eventing_version=1.22.2
serving_version=1.22.1
coredns_version=v1.15.0
export CGO_ENABLED=0 GOMAXPROCS="${GOMAXPROCS:-2}"
command -v go >/dev/null || { echo "build_knative.sh: go is not installed" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/build.lock"
flock 9

# build_vendored NAME VERSION PACKAGE...: go build -mod=vendor in the unpacked release tree.
build_vendored() {
  local name=$1 version=$2; shift 2
  local out="$cache/$name-$version/bin"
  if [ ! -f "$out/.complete" ]; then
    local tarball="$third_party/knative-$name-$version.tar.xz"
    [ -f "$tarball" ] || { echo "build_knative.sh: $tarball is missing" >&2; exit 1; }
    local src="$cache/$name-$version/src"
    rm -rf "$src" && mkdir -p "$src" "$out"
    tar -xJf "$tarball" -C "$src" --strip-components=1
    local start; start=$(date +%s)
    echo "build_knative.sh: building knative $name $version (first build takes a few minutes)" >&2
    (cd "$src" && go build -mod=vendor -trimpath -ldflags="-s -w" -o "$out/" "$@" >&2)
    # The release manifests are kept with the binaries; the sources are not needed any more.
    rm -rf "$out/../config" && cp -rL "$src/config" "$out/../config"
    rm -rf "$src"
    touch "$out/.complete"
    echo "build_knative.sh: knative $name built in $(( $(date +%s) - start ))s" >&2
  fi
  echo "$name=$out"
}

build_vendored eventing "$eventing_version" ./cmd/controller ./cmd/webhook ./cmd/broker/ingress \
  ./cmd/broker/filter ./cmd/mtchannel_broker ./cmd/in_memory/channel_controller \
  ./cmd/in_memory/channel_dispatcher ./cmd/mtping
build_vendored serving "$serving_version" ./cmd/activator ./cmd/autoscaler ./cmd/controller \
  ./cmd/queue ./cmd/webhook

# CoreDNS with the harness's plugins alone (testbed/kubernetes/coredns/main.go): the whole
# release (every cloud provider's SDK) took 6 minutes; rebuilt when that source changes.
coredns_src="$here/coredns"
sum=$(cat "$coredns_src"/go.mod "$coredns_src"/*.go | sha256sum | cut -c1-16)
coredns="$cache/coredns-$coredns_version-$sum/bin"
if [ ! -x "$coredns/coredns" ]; then
  echo "build_knative.sh: building coredns $coredns_version (the harness's plugins)" >&2
  work="$cache/coredns-$coredns_version-$sum/src"
  rm -rf "$work" && mkdir -p "$work" "$coredns"
  cp "$coredns_src"/go.mod "$coredns_src"/*.go "$work/"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2 \
     && GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$coredns/coredns" . >&2)
  rm -rf "$work"
fi
echo "coredns=$coredns"

# The test-only KIngress proxy: rebuilt whenever its source changes.
kingress_src="$here/kingress"
sum=$(cat "$kingress_src"/go.mod "$kingress_src"/*.go | sha256sum | cut -c1-16)
kingress="$cache/kingress-$sum/bin"
if [ ! -x "$kingress/kingress" ]; then
  mkdir -p "$kingress"
  (cd "$kingress_src" && GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" \
     -o "$kingress/kingress" . >&2)
fi
echo "kingress=$kingress"
