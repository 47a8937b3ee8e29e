#!/usr/bin/env bash
# The README's first command, `bash .ci/setup && python3 -m functions demo`, timed on a fresh
# Debian 12 for each git revision given (default HEAD), each in a root of its own:
#
#   bench/first_run.sh                 # HEAD
#   bench/first_run.sh fdfb066 HEAD    # a baseline, then HEAD: times and the ratio
#
# The fresh machine is a debootstrap'd bookworm minbase, plus what any Debian 12 server has
# and minbase lacks (the shared libraries Python links, CA certificates), and this machine's CA
# bundle (its egress may need it). Nothing of the project is installed: no Debian package, no
# Python package, no cache. This machine's Python (in a new venv: its site-packages stay out),
# and its Go and kubectl if present, are bind-mounted read-only, as a machine image would hold
# them. The demo runs in a network namespace of its own, so its Podman bridge and firewall
# rules never meet the host's; the Podman API service it leaves running is stopped by its pid.
# Needs root, debootstrap and the network (the Debian mirror, PyPI; Go's proxy for old revs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/rf-first-run.XXXXXX)
revs=("$@"); [ "${#revs[@]}" -gt 0 ] || revs=(HEAD)
python_home=$(python3 -c 'import sys; print(sys.base_prefix)')
env_vars=(HOME=/root LANG=C.UTF-8 "PATH=/opt/py/bin:/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1)

echo "building the fresh Debian 12 root once (debootstrap, about a minute)" >&2
debootstrap --variant=minbase bookworm "$work/base" http://deb.debian.org/debian >"$work/debootstrap.log"
cp /etc/apt/sources.list.d/debian.sources "$work/base/etc/apt/sources.list.d/" 2>/dev/null \
  && rm -f "$work/base/etc/apt/sources.list"
printf '#!/bin/sh\nexit 101\n' >"$work/base/usr/sbin/policy-rc.d"  # no service starts in the root
chmod +x "$work/base/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$work/base/etc/"
mount -t proc proc "$work/base/proc"
chroot "$work/base" env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq &&
  apt-get install -y -qq --no-install-recommends ca-certificates libssl3 libffi8 zlib1g \
    libbz2-1.0 liblzma5 libsqlite3-0 libreadline8 libuuid1 >/dev/null &&
  apt-get clean && rm -rf /var/lib/apt/lists/*' >>"$work/debootstrap.log" 2>&1
umount "$work/base/proc"
cp /etc/ssl/certs/ca-certificates.crt "$work/base/etc/ssl/certs/"
tar -C "$work/base" -cf "$work/base.tar" .

bind_ro() {  # host path, root: the same path inside the root, read-only
  [ -e "$1" ] || return 0
  if [ -d "$1" ]; then mkdir -p "$2$1"; else mkdir -p "$(dirname "$2$1")"; touch "$2$1"; fi
  mount --bind "$1" "$2$1" && mount -o remount,bind,ro "$2$1"
}

unmount_all() {  # the root's mounts, deepest first
  local m
  for _ in 1 2 3; do
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done \
      < <(awk -v r="$1" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r -u)
  done
}

time_rev() {  # rev -> "setup_seconds demo_seconds"
  local root="$work/root" log="$work/${1//\//_}" start mid end
  rm -rf "$root"; mkdir -p "$root"; tar -C "$root" -xf "$work/base.tar"
  mount --bind "$root" "$root"  # runc and buildah need the root to be a mount point
  bind_ro "$python_home" "$root"; bind_ro /usr/local/go "$root"; bind_ro /usr/bin/kubectl "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"; mount --make-rslave "$root/sys"
  mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"
  mount -t tmpfs tmpfs "$root/run"
  mkdir -p "$root/src"; git -C "$repo" archive "$1" | tar -x -C "$root/src"
  chroot "$root" "$python_home/bin/python3" -m venv /opt/py
  start=$(date +%s.%N)
  chroot "$root" env -i "${env_vars[@]}" bash -c 'cd /src && bash .ci/setup' >"$log.setup.log" 2>&1 \
    || { echo "$1: .ci/setup failed, see $log.setup.log" >&2; exit 1; }
  mid=$(date +%s.%N)
  unshare -n sh -c "ip link set lo up && chroot $root env -i ${env_vars[*]} bash -c 'cd /src && python3 -m functions demo'" \
    >"$log.demo.log" 2>&1 || { echo "$1: the demo failed, see $log.demo.log" >&2; exit 1; }
  end=$(date +%s.%N)
  echo "$(echo "$mid - $start" | bc) $(echo "$end - $mid" | bc)"
  leave "$root"
}

leave() {  # stop what the demo left running in the root (its Podman API service), unmount it
  local pid
  for pid in /proc/[0-9]*; do
    [ "$(readlink "$pid/root" 2>/dev/null)" = "$1" ] && kill "${pid#/proc/}" 2>/dev/null || true
  done
  sleep 1; unmount_all "$1"; rm -rf "$1"
}
trap 'leave "$work/root"; unmount_all "$work/base"; rm -rf "$work/base" "$work/base.tar"' EXIT

printf '%-12s %10s %10s %10s %8s\n' rev setup_s demo_s total_s ratio
first=""
for rev in "${revs[@]}"; do
  time_rev "$rev" >"$work/times"
  read -r setup demo <"$work/times"
  total=$(echo "$setup + $demo" | bc)
  first=${first:-$total}
  printf '%-12s %10.1f %10.1f %10.1f %7.2fx\n' "$rev" "$setup" "$demo" "$total" "$(echo "$first / $total" | bc -l)"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); logs in $work" >&2
