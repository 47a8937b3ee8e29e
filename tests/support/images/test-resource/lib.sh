# Helpers for the test resource: read fields of the stdin payload with busybox tools only.
# The payloads in the tests are flat enough for grep; this is a test fixture, not a parser.
payload=$(cat)
field() { echo "$payload" | grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
number() { echo "$payload" | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
mode=$(field mode)
# "delay": seconds to sleep before doing the action's work (a long get, a long check).
delay=$(number delay); [ -n "$delay" ] && sleep "$delay"
# Deliberately print the secret to stderr: the functions must redact it from logs.
echo "$(basename "$0") mode=${mode:-ok} password=$(field password)" >&2
# The trace context handed over in the env (the tests look for it in the stored log).
echo "traceparent=${TRACEPARENT:-none}" >&2
# "hostile": replace what the resource step leaves for collect ("target": a file of
# /tmp/build/.task, or the task dir or the get's output dir itself) with a link to
# /proc/self/environ (a directory: to /proc/self), a FIFO or a 10 GiB sparse file ("as").
hostile() {
  case "$1" in .task) path=/tmp/build/.task ;; get) path=/tmp/build/get ;; *) path=/tmp/build/.task/$1 ;; esac
  rm -rf "$path"
  case "$2" in
    link) if [ "$1" = .task ] || [ "$1" = get ]; then ln -s /proc/self "$path"; else ln -s /proc/self/environ "$path"; fi ;;
    fifo) mkfifo "$path" ;;
    sparse) truncate -s 10G "$path" ;;
  esac
}
[ "$mode" = hostile ] && hostile "$(field target)" "$(field as)"
# "hijack_names" (as root): point "names" (space-separated) at 127.0.0.1 in the pod's
# /etc/hosts and put a bogus name server (TEST-NET-1: unreachable) first in its
# /etc/resolv.conf; with "resolv":"only", the only one. Both are single files mounted into
# every container of the pod, so they are rewritten in place. Then the action's ordinary
# work. Exits 5 if it could not.
hijack_names() {
  for name in $1; do echo "127.0.0.1 $name" >>/etc/hosts || exit 5; done
  kept=$(cat /etc/resolv.conf) || exit 5
  [ "$2" = only ] && kept=$(echo "$kept" | grep -v '^nameserver')
  printf 'nameserver 192.0.2.53\n%s\n' "$kept" >/etc/resolv.conf || exit 5
  echo "hijacked: $1 (resolv: ${2:-first})" >&2
}
[ "$mode" = hijack_names ] && hijack_names "$(field names)" "$(field resolv)"
case "$mode" in
  fail) echo "error: cannot reach the repository" >&2; exit 3 ;;
  echo) echo "debug: $payload" >&2; exit 2 ;;
  malformed) echo "this is not json"; exit 0 ;;
  badversion) echo '[{"ref": 1}]'; exit 0 ;;
  slow) sleep "$(number seconds)"; echo 'null'; exit 0 ;;
  # "forms": print what the test made (a secret in every form: busybox has no encoder for
  # most), "stderr_b64" decoded to stderr and "stdout_b64" to stdout; exit "exit_code".
  forms) field stderr_b64 | base64 -d >&2; field stdout_b64 | base64 -d
         code=$(number exit_code); exit "${code:-0}" ;;
  # "straddle": the password, then enough bytes that the log's 4 MiB tail starts "keep"
  # bytes before the password's end.
  straddle) printf '%s' "$(field password)" >&2
            head -c $((4194304 - $(number keep))) /dev/zero | tr '\0' x >&2; echo '[]'; exit 0 ;;
  # "flood": more than the limits on both streams (8 MiB stdout, 4 MiB stderr), interleaved;
  # stdout starts with a valid answer, stderr ends with a marker.
  flood) echo '[{"ref":"1"}]'; i=0; while [ $i -lt 600 ]; do
           head -c 16384 /dev/zero | tr '\0' o; head -c 8192 /dev/zero | tr '\0' e >&2
           i=$((i + 1)); done; echo "stderr-end-marker" >&2; exit 0 ;;
esac
