"""The test cluster's probes (testbed/kubernetes/knative.py, fit_probes_to_the_test_node): a
probe that gives less than PROBE_TIMEOUT_SECONDS (or nothing: Kubernetes' 1 s) gets that
much, a longer one stays; a container with a liveness probe and no startup probe gets one of
the same check that allows STARTUP_SECONDS; nothing else of a probe changes."""

from __future__ import annotations

from testbed.kubernetes.knative import (
    PROBE_TIMEOUT_SECONDS,
    STARTUP_PERIOD_SECONDS,
    STARTUP_SECONDS,
    fit_probes_to_the_test_node,
)


def workload(*containers: dict) -> dict:
    return {"kind": "StatefulSet", "spec": {"template": {"spec": {"containers": list(containers)}}}}


def test_short_timeouts_are_lengthened_and_the_rest_of_a_probe_stays() -> None:
    liveness = {"exec": {"command": ["ls", "/proc/1"]}, "periodSeconds": 3, "timeoutSeconds": 1}
    readiness = {"httpGet": {"path": "/readyz", "port": 8080}, "failureThreshold": 3}
    long = {"tcpSocket": {"port": 9090}, "timeoutSeconds": PROBE_TIMEOUT_SECONDS + 5}
    container = {"livenessProbe": liveness, "readinessProbe": readiness, "startupProbe": long}
    fit_probes_to_the_test_node(workload(container))
    assert liveness == {
        "exec": {"command": ["ls", "/proc/1"]},
        "periodSeconds": 3,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
    }
    assert readiness == {
        "httpGet": {"path": "/readyz", "port": 8080},
        "failureThreshold": 3,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
    }
    # the release's own startup probe stays as it is
    assert container["startupProbe"] == {
        "tcpSocket": {"port": 9090},
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS + 5,
    }


def test_a_liveness_probe_waits_for_a_startup_probe_of_the_same_check() -> None:
    liveness = {
        "httpGet": {"path": "/healthz", "port": 8080},
        "initialDelaySeconds": 10,
        "periodSeconds": 3,
        "failureThreshold": 3,
    }
    container = {"name": "receiver", "livenessProbe": liveness}
    fit_probes_to_the_test_node(workload(container))
    startup = container["startupProbe"]
    assert startup == {
        "httpGet": {"path": "/healthz", "port": 8080},
        "periodSeconds": STARTUP_PERIOD_SECONDS,
        "failureThreshold": STARTUP_SECONDS // STARTUP_PERIOD_SECONDS,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
    }
    assert startup["periodSeconds"] * startup["failureThreshold"] >= STARTUP_SECONDS
    assert liveness["initialDelaySeconds"] == 10 and liveness["failureThreshold"] == 3


def test_a_container_without_probes_gets_none() -> None:
    bare = {"name": "no-probes"}
    readiness_only = {"name": "web", "readinessProbe": {"tcpSocket": {"port": 80}}}
    fit_probes_to_the_test_node(workload(bare, readiness_only))
    assert bare == {"name": "no-probes"}
    assert "startupProbe" not in readiness_only
