"""The test cluster's cap on release CPU requests (testbed/kubernetes/knative.py): a request
above it comes down to it, one below stays, memory and every limit stay as released."""

from __future__ import annotations

import pytest

from testbed.kubernetes.knative import CPU_REQUEST_CAP_MILLICORES, cap_cpu_requests, millicores


def workload(*containers: dict) -> dict:
    return {"kind": "Deployment", "spec": {"template": {"spec": {"containers": list(containers)}}}}


@pytest.mark.parametrize(
    ("quantity", "expected"), [("300m", 300), ("1", 1000), ("0.5", 500), ("25m", 25)]
)
def test_millicores_reads_kubernetes_cpu_quantities(quantity: str, expected: float) -> None:
    assert millicores(quantity) == expected


def test_only_cpu_requests_above_the_cap_come_down() -> None:
    big = {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}}
    small = {"resources": {"requests": {"cpu": "10m"}}}
    bare = {"name": "no-resources"}
    doc = workload(big, small, bare)
    cap_cpu_requests(doc)
    assert big["resources"] == {
        "requests": {"cpu": f"{CPU_REQUEST_CAP_MILLICORES}m", "memory": "1Gi"},
        "limits": {"cpu": "2"},
    }
    assert small["resources"] == {"requests": {"cpu": "10m"}}
    assert bare == {"name": "no-resources"}
