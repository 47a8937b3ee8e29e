#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and a matching kubectl
# from the k8s.io/kubernetes Go module (no source checkout): a throw-away go.mod in the cache
# directory requires k8s.io/kubernetes at one release and replaces each k8s.io/* staging module
# (v0.0.0 in kubernetes' own go.mod) with the published version of the same release. One `go build`
# of the five main packages compiles the shared packages once. The binaries are cached by version;
# a second run is free.
#
#   testbed/kubernetes/build.sh            # prints the directory holding the binaries
#   K8S_VERSION=v1.34.4 testbed/kubernetes/build.sh
set -euo pipefail

version="${K8S_VERSION:-v1.34.4}"
cache="${RF_CLUSTER_CACHE:-$HOME/.cache/resource-functions/kubernetes}"
out="$cache/$version/bin"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)

have_all() {
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
  [ -f "$out/.complete" ]
}
if have_all; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
mod="$cache/$version/module"
mkdir -p "$mod" "$out"
# One build at a time; a caller that waited finds the binaries made by the other.
exec 9>"$cache/$version/build.lock"
flock 9
if have_all; then echo "$out"; exit 0; fi
staging_version="v0.${version#v1.}"   # v1.34.4 -> v0.34.4

# kubernetes' go.mod names every staging module that needs a replacement.
kmod="$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
mapfile -t staging < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$kmod")
[ "${#staging[@]}" -gt 10 ] || { echo "build.sh: no staging modules found in $kmod" >&2; exit 1; }

{
  echo "module localbuild/kubernetes"
  echo
  echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kmod")"
  echo
  sed -n 's/^godebug .*/&/p' "$kmod"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  for m in "${staging[@]}"; do
    # sample-* modules are not needed by any binary and some releases do not publish them.
    case "$m" in k8s.io/sample-*) continue ;; esac
    echo "	$m => $m $staging_version"
  done
  echo ")"
} > "$mod/go.mod"
rm -f "$mod/go.sum"

pkgs=()
for b in "${binaries[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done

ldpkg=k8s.io/component-base/version
ldflags="-s -w -X $ldpkg.gitVersion=$version -X $ldpkg.gitMajor=1 -X $ldpkg.gitMinor=$(echo "$version" | cut -d. -f2)"
ldflags+=" -X $ldpkg.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$version"

start=$(date +%s)
cd "$mod"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOMAXPROCS="${GOMAXPROCS:-2}"
go get "${pkgs[@]/%/@$version}" >&2 2>"$mod/get.log" || { cat "$mod/get.log" >&2; exit 1; }
echo "build.sh: building ${binaries[*]} $version (first build takes a while)" >&2
go build -trimpath -ldflags="$ldflags" -o "$out/" "${pkgs[@]}" >&2
touch "$out/.complete"
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
