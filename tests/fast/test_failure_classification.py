"""One decision of "retry or fail": the HTTP table every dependency's answers go through, the
classification of errors, and the image-pull rule both runtimes apply to a registry's
answers (Podman's API words and the kubelet's ErrImagePull words)."""

from __future__ import annotations

import pytest

from functions.errors import (
    FunctionError,
    InvalidRequest,
    SinkRefused,
    Unavailable,
    classify,
    pull_is_transient,
)
from functions.model import FAILURE_KINDS
from functions.runtimes.kube.job_status import judge
from functions.sink import RETRYABLE
from storage.store_errors import ArchiveRejected, ObjectNotFound, StoreUnavailable, retryable_status


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (0, True),
        (400, False),
        (401, True),
        (403, True),
        (404, False),
        (408, True),
        (409, True),
        (412, False),
        (422, False),
        (429, True),
        (500, True),
        (501, True),
        (503, True),
    ],
)
def test_one_table_of_http_answers_worth_retrying(status: int, retryable: bool) -> None:
    assert retryable_status(status) is retryable
    if 400 <= status < 600:
        assert (status in RETRYABLE) is retryable  # the sink's session retries the same


@pytest.mark.parametrize(
    ("error", "kind", "retryable"),
    [
        (StoreUnavailable("s3 down"), "storage", True),
        (ObjectNotFound("gone"), "storage", False),
        (ArchiveRejected("a FIFO"), "storage", False),
        (SinkRefused("sink 503"), "runtime", True),
        (Unavailable("engine down"), "runtime", True),
        (InvalidRequest("bad"), "runtime", False),
        (FunctionError("bug"), "runtime", False),
    ],
)
def test_classify_gives_a_kind_of_the_contract_and_whether_to_retry(
    error: Exception, kind: str, retryable: bool
) -> None:
    verdict = classify(error)
    assert (verdict.kind, verdict.retryable, verdict.message) == (kind, retryable, str(error))
    assert verdict.kind in FAILURE_KINDS


PULL = 'failed to pull and unpack image "r/x:1": failed to resolve reference "r/x:1": '
HEAD = "unexpected status from HEAD request to http://r/v2/x/manifests/1: "
PULLS = [
    # Podman's libpod pull answers (as the engine reports them)
    (
        "reading manifest 1 in r/down: received unexpected HTTP status: 503 Service Unavailable",
        True,
    ),
    ("reading manifest 1 in r/busy: StatusCode: 429, ", True),
    ('pinging container registry r: Get "https://r/v2/": dial tcp: i/o timeout', True),
    ("reading manifest 1 in r/nope: manifest unknown", False),
    ("reading manifest 1 in r/locked: unauthorized", False),
    ("failed to find image localhost/rf-no-such-image:1: No such image", False),
    # the kubelet's ErrImagePull / ImagePullBackOff messages (containerd's words)
    (PULL + HEAD + "503 Service Unavailable", True),
    (PULL + HEAD + "429 Too Many Requests", True),
    (PULL + "failed to do request: Head: dial tcp: connect: connection refused", True),
    (PULL + "r/x:1: not found", False),
    (PULL + "pull access denied, repository does not exist or may require authorization", False),
    (PULL + "unexpected status: 401 Unauthorized", False),
    ('Back-off pulling image "r/x:1": ErrImagePull: [...] 503 Service Unavailable', True),
]


@pytest.mark.parametrize(("message", "transient"), PULLS)
def test_a_registry_down_or_busy_is_retried_an_unknown_or_refused_image_fails(
    message: str, transient: bool
) -> None:
    assert pull_is_transient(message) is transient


@pytest.mark.parametrize(("message", "transient"), PULLS)
def test_the_kubernetes_runtime_judges_a_pull_failure_by_the_same_rule(
    message: str, transient: bool
) -> None:
    pod = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "resource",
                    "image": "r/x:1",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": message}},
                }
            ],
        }
    }
    verdict = judge({"status": {}}, [pod], deadline_passed=False)
    assert verdict is not None
    assert verdict.kind == ("unavailable" if transient else "image_pull")
    assert verdict.failure == "image_pull"
