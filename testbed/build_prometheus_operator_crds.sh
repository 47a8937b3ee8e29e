#!/usr/bin/env bash
# Generate (or reuse) the Prometheus Operator's CustomResourceDefinitions, to validate
# knative/monitoring/ against: controller-gen (sigs.k8s.io/controller-tools) run on the
# operator's Go API types (github.com/prometheus-operator/prometheus-operator/pkg/apis/
# monitoring), both Go modules, as the operator generates its own CRDs. Cached by version under
# ~/.cache/resource-functions/prometheus-operator-crds-<version>/ (about 3 minutes the first
# time, for controller-gen; free after). Prints the folder.
#
#   testbed/build_prometheus_operator_crds.sh
set -euo pipefail

version="${PROMETHEUS_OPERATOR_VERSION:-v0.86.2}"
tools="${CONTROLLER_TOOLS_VERSION:-v0.19.0}"
root="${RF_CACHE:-$HOME/.cache/resource-functions}"
out="$root/prometheus-operator-crds-$version"
gen="$root/controller-gen-$tools/controller-gen"

if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "build_prometheus_operator_crds.sh: go is not installed" >&2; exit 1; }
mkdir -p "$root"
exec 9>"$root/prometheus-operator-crds.lock"
flock 9
if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi

export GOFLAGS=-mod=mod GOMAXPROCS="${GOMAXPROCS:-2}"
if [ ! -x "$gen" ]; then
  echo "build_prometheus_operator_crds.sh: building controller-gen $tools" >&2
  GOBIN="$(dirname "$gen")" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$tools" >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
api=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
(
  cd "$work"
  go mod init rf-crds >/dev/null 2>&1
  go get "$api@$version" >&2
  printf 'package crds\n\nimport _ "%s/v1"\n' "$api" > tools.go
  go mod tidy >&2
  rm -rf "$out"
  "$gen" crd:crdVersions=v1,allowDangerousTypes=true paths="$api/v1" output:crd:dir="$out" >&2
)
touch "$out/.complete"
echo "$out"
