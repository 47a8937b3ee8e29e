# Phase times for .ci/run and .ci/cluster (sourced): `phase NAME COMMAND...` runs COMMAND and
# appends "NAME<TAB>start<TAB>end<TAB>exit code" to $CI_PHASES (one file for a whole run, so
# builds in the background record theirs there too); `phases_report` prints them as a table,
# offsets from the first start, so overlapping phases show as such.

CI_PHASES="${CI_PHASES:-$(mktemp /tmp/ci-phases.XXXXXX)}"
export CI_PHASES

phase() {
  local name=$1 start end code=0
  shift
  start=$(date +%s.%N)
  "$@" || code=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\n' "$name" "$start" "$end" "$code" >> "$CI_PHASES"
  return "$code"
}

phases_report() {
  python3 - "$CI_PHASES" <<'REPORT'
import sys

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
if rows:
    origin = min(float(r[1]) for r in rows)
    print(f"\n{'phase':<44} {'from':>7} {'took':>8}  exit")
    for name, start, end, code in sorted(rows, key=lambda r: float(r[1])):
        begun, took = float(start) - origin, float(end) - float(start)
        print(f"{name:<44} {begun / 60:6.1f}m {took / 60:7.1f}m  {code}")
    end = max(float(r[2]) for r in rows)
    print(f"{'whole run':<44} {0:6.1f}m {(end - origin) / 60:7.1f}m")
REPORT
}
