#!/usr/bin/env bash
# Build what the test cluster needs to run Tekton, once, cached by release: Tekton Pipelines and
# Triggers, from the release sources with their vendor/ folders in ../shared/third_party (the
# Triggers modules are not served here), as static binaries, offline. Each release's config/
# (its manifests) is kept beside its binaries; the unpacked sources are deleted.
#   pipeline: controller, webhook, and the binaries the controller injects into task pods
#             (entrypoint, nop, workingdirinit, sidecarlogresults). Left out: the resolvers
#             (no taskRef uses a remote resolver) and the events controller (it only sends
#             CloudEvents of runs to a config-events sink).
#   triggers: controller, webhook, eventlistenersink (the EventListener pods' image) and the
#             core interceptors: an EventListener exits at start (and crash-loops) until
#             at least one https ClusterInterceptor has a caBundle, which the core interceptors'
#             server writes, even when no trigger uses an interceptor.
# Prints one line per release: NAME=DIR. About 2.5 minutes on 2 cores the first time (an empty Go
# build cache; 5 minutes while another build runs), then free.
#
#   tests/cluster/build_tekton.sh
#   RF_THIRD_PARTY=/path/to/third_party tests/cluster/build_tekton.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
third_party="${RF_THIRD_PARTY:-$here/../../../shared/third_party}"
cache="${RF_CLUSTER_CACHE:-$HOME/.cache/resource-functions}/tekton"
pipeline_version=1.15.0
triggers_version=0.37.0
export CGO_ENABLED=0 GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
command -v go >/dev/null || { echo "build_tekton.sh: go is not installed" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/build.lock"
flock 9

# build_release NAME VERSION PACKAGE...: go build in the unpacked release tree.
build_release() {
  local name=$1 version=$2; shift 2
  local out="$cache/$name-$version/bin"
  if [ ! -f "$out/.complete" ]; then
    local tarball="$third_party/tekton-$name-$version.tar.xz"
    [ -f "$tarball" ] || { echo "build_tekton.sh: $tarball is missing" >&2; exit 1; }
    local src="$cache/$name-$version/src"
    rm -rf "$src" "$out" && mkdir -p "$src" "$out"
    tar -xJf "$tarball" -C "$src" --strip-components=1
    local start; start=$(date +%s)
    echo "build_tekton.sh: building tekton $name $version (first build takes minutes)" >&2
    (cd "$src" && go build -trimpath -ldflags="-s -w" -o "$out/" "$@" >&2)
    # The release manifests are kept with the binaries; the sources are not needed any more.
    rm -rf "$out/../config" && cp -rL "$src/config" "$out/../config"
    rm -rf "$src"
    touch "$out/.complete"
    echo "build_tekton.sh: tekton $name built in $(( $(date +%s) - start ))s" >&2
  fi
  echo "$name=$out"
}

build_release pipeline "$pipeline_version" ./cmd/controller ./cmd/webhook ./cmd/entrypoint \
  ./cmd/nop ./cmd/workingdirinit ./cmd/sidecarlogresults
build_release triggers "$triggers_version" ./cmd/controller ./cmd/webhook ./cmd/eventlistenersink \
  ./cmd/interceptors
