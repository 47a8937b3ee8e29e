#!/usr/bin/env bash
# Build rf-agent (static: CGO off, no module outside the standard library) into $RF_BIN
# (default ~/.cache/resource-functions/bin), once per source: a stamp names its hash. Prints
# the binary's path. Needs Go 1.19 or newer; about 10 s the first time on 2 cores.
#
#   agent/build.sh                 # the local engine's warm checks find it there (or on PATH)
#   RF_BIN=/some/dir agent/build.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${RF_BIN:-$HOME/.cache/resource-functions/bin}"
command -v go >/dev/null || { echo "agent/build.sh: go is not installed" >&2; exit 1; }
sum=$(cat "$here/go.mod" "$here"/*.go | sha256sum | cut -c1-16)
mkdir -p "$out"
if [ ! -f "$out/.rf-agent-$sum" ] || [ ! -x "$out/rf-agent" ]; then
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local \
     go build -trimpath -ldflags="-s -w" -o "$out/rf-agent.new" .)
  mv "$out/rf-agent.new" "$out/rf-agent"
  rm -f "$out"/.rf-agent-*
  touch "$out/.rf-agent-$sum"
fi
echo "$out/rf-agent"
