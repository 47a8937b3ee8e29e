# The request on stdin, and its fields read with Debian's python3 (the image has no jq).
payload=$(cat)
# field KEY...: the value at that path of keys ("" when absent)
field() {
  printf '%s' "$payload" | python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value.get(key) if isinstance(value, dict) else None
print("" if value is None else value)' "$@"
}
uri=$(field source uri)
branch=$(field source branch)
