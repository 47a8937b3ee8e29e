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
case "$mode" in
  fail) echo "error: cannot reach the repository" >&2; exit 3 ;;
  echo) echo "debug: $payload" >&2; exit 2 ;;
  malformed) echo "this is not json"; exit 0 ;;
  badversion) echo '[{"ref": 1}]'; exit 0 ;;
  slow) sleep "$(number seconds)"; echo 'null'; exit 0 ;;
  # "flood": more than the limits on both streams (8 MiB stdout, 4 MiB stderr), interleaved;
  # stdout starts with a valid answer, stderr ends with a marker.
  flood) echo '[{"ref":"1"}]'; i=0; while [ $i -lt 600 ]; do
           head -c 16384 /dev/zero | tr '\0' o; head -c 8192 /dev/zero | tr '\0' e >&2
           i=$((i + 1)); done; echo "stderr-end-marker" >&2; exit 0 ;;
esac
