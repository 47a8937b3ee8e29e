"""CRD schemas made strict: the offline stand-in for kubectl's strict field validation."""

from __future__ import annotations

from typing import Any


def strict_schema(node: Any) -> Any:
    """Reject fields a CRD schema does not document, wherever it lists properties.

    Without x-kubernetes-preserve-unknown-fields the API server prunes unknown fields
    (kubectl's strict field validation makes that an error). Where a CRD does preserve
    them (Trigger.spec, delivery: room for experimental features) the cluster keeps a
    typo and ignores it: a misspelled `filter` makes a Trigger match every event, replies
    included. These manifests use documented fields only, so both cases are errors here.
    """
    if isinstance(node, list):
        return [strict_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if "properties" in out:
        out["properties"] = {k: strict_schema(v) for k, v in out["properties"].items()}
        if out.get("x-kubernetes-preserve-unknown-fields") and "backoffDelay" in out["properties"]:
            # A delivery spec: its `timeout` (feature delivery-timeout, enabled by default in
            # config-features) is documented but kept out of the CRD schema.
            out["properties"]["timeout"] = {"type": "string", "pattern": r"^PT[0-9.]+[HMS]"}
        out.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = strict_schema(out[key])
    return out
