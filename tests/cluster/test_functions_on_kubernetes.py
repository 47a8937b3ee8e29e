"""check, get and put end to end on a real single-node Kubernetes (``testbed/kubernetes``).

The three services run on this machine as processes (``python -m functions serve``) with a
token of the ``resource-functions`` ServiceAccount, bound to the Role of ``knative/rbac.yaml``;
every task is a real Job whose pod runs the real init containers (``stage``, ``resource``)
and the ``collect`` step of the project image, moving artifacts through the S3 server on
the CNI bridge's host-side address. Tests run in file order; each uses its own sources so
that no cache hit or redelivery crosses tests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
import time
import uuid

import pytest
from cloudevents.core.v1.event import CloudEvent

from functions.cli.launch import wait_until
from storage.archive import format_for_key, unpack
from storage.artifacts import add_team
from tests.cluster.probes import run_pod
from tests.support.events import request_event, send
from tests.support.parallel import parallel
from tests.support.round_trip import get_new_version, put_fetched
from tests.support.runs import run_of
from tests.support.secret_forms import HOSTILE, printed_forms, survivors

CANARY = "canary-5e1d0c7a-cluster-do-not-leak"
SOURCE = {"uri": "https://git.example.com/repo.git", "password": CANARY}
LABEL = "resource-functions.dev/"


def run_id_of(job: dict) -> str:
    return job["metadata"]["labels"][f"{LABEL}run-id"]


def new_jobs(deployment, before: set[str], action: str) -> list[dict]:
    return [
        j
        for j in deployment.jobs(**{f"{LABEL}action": action})
        if j["metadata"]["name"] not in before
    ]


def job_names(deployment, action: str) -> set[str]:
    return {j["metadata"]["name"] for j in deployment.jobs(**{f"{LABEL}action": action})}


def complete(job: dict) -> bool:
    return any(
        c["type"] == "Complete" and c["status"] == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def read_object(store, key: str) -> bytes:
    with store.open(key) as stream:
        return stream.read()


def key_of(deployment, url: str) -> str:
    prefix = deployment.store.url.rstrip("/") + "/"
    assert url.startswith(prefix), url
    return url[len(prefix) :]


def test_node_is_ready_and_runs_the_local_images(cluster, cluster_images):
    node = json.loads(cluster.kubectl("get", "node", "rf-node", "-o", "json"))
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    images = cluster.ctr("images", "ls", "-q").stdout.split()
    assert set(cluster_images.values()) <= set(images)


def test_check_runs_one_job_with_the_pod_layout_of_the_design(deployment):
    before = job_names(deployment, "check")
    data = {"type": "test", "source": {**SOURCE, "nonce": uuid.uuid4().hex}}
    event = request_event("check", data, subject="main/repo")
    status, reply, response = send(deployment.services.urls["check"], event)
    assert status == 200, response.text
    assert reply.get_type() == "dev.resourcefunctions.check.succeeded", reply.get_data()
    assert reply.get_extension("requestid") == event.get_id()
    assert reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]

    [job] = new_jobs(deployment, before, "check")
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] > 0
    # The function answers once the pod has succeeded; the Job controller marks the Job
    # Complete a moment later.
    job = wait_until(
        lambda: deployment.job_if(job["metadata"]["name"], complete), "the Job complete", 30
    )
    [pod] = deployment.pods(job["metadata"]["name"])
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])
    assert pod["spec"]["serviceAccountName"] == "resource-task"
    # No API identity in task pods: no projected token volume was injected.
    assert all("projected" not in v for v in pod["spec"]["volumes"])
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["resource"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["collect"]
    statuses = pod["status"]["initContainerStatuses"] + pod["status"]["containerStatuses"]
    assert all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["podIP"].startswith("10.244.0.")
    # The stdin Secret (credentials) is gone once the task is decided.
    secrets = deployment.cluster.kubectl(
        "-n",
        deployment.namespace,
        "get",
        "secrets",
        "-o",
        "name",
        "-l",
        f"{LABEL}run-id={run_id_of(job)}",
    )
    assert secrets.strip() == ""


def test_get_stores_the_artifact_and_a_repeat_is_a_cache_hit(deployment, tmp_path):
    ref = f"v-{uuid.uuid4().hex[:8]}"
    data = {
        "type": "test",
        "source": SOURCE,
        "version": {"ref": ref},
        "params": {"kib": 200},
        "build": {"id": "77", "pipeline": "main", "job": "unit"},
    }
    before = job_names(deployment, "get")
    status, reply, response = send(deployment.services.urls["get"], request_event("get", data))
    assert status == 200, response.text
    assert reply.get_type() == "dev.resourcefunctions.get.succeeded", reply.get_data()
    body = reply.get_data()
    assert body["version"] == {"ref": ref} and body["cached"] is False
    assert body["metadata"] == [{"name": "build", "value": "77"}]
    artifact = body["artifact"]
    key = key_of(deployment, artifact["url"])
    raw = read_object(deployment.store, key)
    assert artifact["size"] == len(raw)
    assert artifact["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    unpack(
        io.BytesIO(raw), tmp_path, format=format_for_key(key), expected_digest=artifact["digest"]
    )
    assert (tmp_path / "version").read_text() == ref + "\n"
    assert (tmp_path / "sub/build.txt").read_text() == "build 77 of main/unit\n"
    assert (tmp_path / "blob").stat().st_size == 200 * 1024
    assert len(new_jobs(deployment, before, "get")) == 1

    status, again, _ = send(deployment.services.urls["get"], request_event("get", data))
    assert status == 200
    assert again.get_data() == {**body, "cached": True}
    assert len(new_jobs(deployment, before, "get")) == 1  # answered from the cache


def test_put_stages_the_artifact_of_a_get(deployment):
    fetched = get_new_version(deployment.services.urls, SOURCE, "p")
    before = job_names(deployment, "put")
    put_fetched(deployment.services.urls, SOURCE, fetched)
    [job] = new_jobs(deployment, before, "put")
    [pod] = deployment.pods(job["metadata"]["name"])
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["stage", "resource"]
    stage = pod["status"]["initContainerStatuses"][0]
    assert stage["name"] == "stage" and stage["state"]["terminated"]["exitCode"] == 0


def test_put_with_a_missing_input_fails_in_the_stage_step(deployment):
    # An artifact of this team (no team) that has gone: the put runs and its stage fails.
    missing = f"artifacts/nope-{uuid.uuid4().hex}.tar.zst"
    add_team(deployment.store, missing, "")
    data = {
        "type": "test",
        "source": SOURCE,
        "params": {"input": "repo"},
        "inputs": {"repo": deployment.store.url_for(missing)},
    }
    status, reply, _ = send(deployment.services.urls["put"], request_event("put", data))
    assert status == 200
    assert reply.get_type() == "dev.resourcefunctions.put.failed"
    error = reply.get_data()["error"]
    assert error["kind"] == "storage", error
    assert "does not exist" in error["message"]


def test_resource_failure_is_a_failed_event_with_a_redacted_log(deployment):
    source = {"mode": "fail", "password": CANARY, "nonce": uuid.uuid4().hex}
    status, reply, _ = send(
        deployment.services.urls["check"],
        request_event("check", {"type": "test", "source": source}),
    )
    assert status == 200
    assert reply.get_type() == "dev.resourcefunctions.check.failed"
    error = reply.get_data()["error"]
    assert error["kind"] == "resource_failed" and error["exit_code"] == 3
    assert "cannot reach the repository" in error["log_tail"]
    assert CANARY not in error["log_tail"] and "[redacted]" in error["log_tail"]


def test_collect_redacts_every_form_before_the_cut_and_refuses_a_secret_version(deployment):
    """The task pod's path: the function puts the values to redact (and the resolved ones
    among them) in the stdin Secret, the resource step writes stderr to a file, collect
    reads its tail (plus the redactor's window), redacts stderr and metadata, and fails a
    version holding the resolved credential."""
    forms = printed_forms(HOSTILE)
    stderr = "cloning https://git.example.com/repo.git\n" + "".join(
        f"form {name}: {text} (end)\n" for name, (text, _) in forms.items()
    )
    metadata = [{"name": name, "value": text} for name, (text, _) in forms.items()]

    def get(version: dict[str, str]) -> tuple[dict, str]:
        stdout = json.dumps({"version": version, "metadata": metadata})
        source = {
            "mode": "forms",
            "password": "((hostile))",
            "nonce": uuid.uuid4().hex,
            "stderr_b64": base64.b64encode(stderr.encode()).decode(),
            "stdout_b64": base64.b64encode(stdout.encode()).decode(),
        }
        data = {"type": "test", "source": source, "version": {"ref": version["ref"]}}
        status, reply, response = send(deployment.services.urls["get"], request_event("get", data))
        assert status == 200, response.text
        return reply.get_data(), response.text

    body, text = get({"ref": "1"})
    assert [m["name"] for m in body["metadata"]] == list(forms), body
    assert all("[redacted]" in m["value"] for m in body["metadata"])
    assert not survivors(text, HOSTILE)
    body, text = get({"ref": "2", "auth": base64.b64encode(f"ci:{HOSTILE}".encode()).decode()})
    assert body["error"]["kind"] == "invalid_output", body
    assert 'version field "auth"' in body["error"]["message"]
    assert not survivors(text, HOSTILE)
    for key in deployment.store.list("logs/"):
        log = read_object(deployment.store, key).decode()
        assert not survivors(log, HOSTILE), key

    source = {"mode": "straddle", "password": CANARY, "keep": 6, "nonce": uuid.uuid4().hex}
    status, reply, _ = send(
        deployment.services.urls["check"],
        request_event("check", {"type": "test", "source": source}),
    )
    assert status == 200 and "versions" in reply.get_data(), reply.get_data()
    cut = [k for k in deployment.store.list("logs/") if deployment.store.stat(k).size > 1 << 20]
    assert len(cut) == 1
    log = read_object(deployment.store, cut[0])
    assert log.startswith(b"[redacted]xxx") and CANARY[-6:].encode() not in log, log[:40]


def test_missing_image_fails_fast_as_image_pull(deployment):
    """The registry (the gateway's stub) says the manifest is unknown: a final image_pull."""
    before = job_names(deployment, "check")
    started = time.monotonic()
    status, reply, _ = send(
        deployment.services.urls["check"],
        request_event("check", {"type": "missing", "source": {"nonce": uuid.uuid4().hex}}),
    )
    elapsed = time.monotonic() - started
    assert status == 200
    error = reply.get_data()["error"]
    assert error["kind"] == "image_pull", error
    assert "nope:1" in error["message"]
    assert elapsed < 60, f"an image-pull failure took {elapsed:.0f}s to report"
    # The function deletes the Job it gave up on (foreground of the pod follows).
    assert new_jobs(deployment, before, "check") == [] or all(
        j["metadata"].get("deletionTimestamp") for j in new_jobs(deployment, before, "check")
    )


def test_a_registry_that_is_down_is_retried_not_a_final_failure(deployment):
    """The registry answers the kubelet's pull with 503: trouble that may pass, as on the local
    runtime (tests/e2e/test_image_pulls.py): the function deletes the Job, records nothing
    and answers 503, so Knative redelivers."""
    event = request_event("check", {"type": "registry-down", "source": {"nonce": uuid.uuid4().hex}})
    started = time.monotonic()
    status, _, response = send(deployment.services.urls["check"], event)
    elapsed = time.monotonic() - started
    assert status == 503, response.text
    assert "down:1" in response.json()["error"]["message"]
    assert elapsed < 60, f"a registry outage took {elapsed:.0f}s to report"
    run = run_of(
        deployment.services.env["CACHE_SECRET"], event.get_source(), event.get_id(), "check"
    )
    assert deployment.store.stat(f"results/{run}.json") is None
    jobs = deployment.jobs(**{f"{LABEL}run-id": run})
    assert all(j["metadata"].get("deletionTimestamp") for j in jobs), jobs


def test_timeout_is_enforced_in_the_pod_and_recorded_with_the_log(deployment):
    from tests.cluster.conftest import SLOW_TIMEOUT_SECONDS, TASK_MARGIN_SECONDS

    before = job_names(deployment, "check")
    started = time.monotonic()
    event = request_event(
        "check",
        {"type": "slow", "source": {"mode": "slow", "seconds": 600, "nonce": uuid.uuid4().hex}},
    )
    status, reply, _ = send(deployment.services.urls["check"], event, timeout=180)
    elapsed = time.monotonic() - started
    assert status == 200
    error = reply.get_data()["error"]
    assert error["kind"] == "timeout", error
    assert f"ran longer than {SLOW_TIMEOUT_SECONDS}s" in error["message"]
    assert "slow" in error["log_tail"]  # collect ran: the script's stderr was kept
    # The resource step's watchdog stops the script; the Job's deadline is only the backstop.
    assert SLOW_TIMEOUT_SECONDS <= elapsed < SLOW_TIMEOUT_SECONDS + TASK_MARGIN_SECONDS, elapsed
    remaining = new_jobs(deployment, before, "check")
    assert remaining and all(not j["status"].get("failed") for j in remaining), remaining
    # A redelivery replays the recorded timeout; it starts nothing.
    status, again, _ = send(deployment.services.urls["check"], event)
    assert status == 200 and again.get_data() == reply.get_data()


def test_redelivery_attaches_to_the_one_job(deployment):
    before = job_names(deployment, "check")
    event = request_event(
        "check", {"type": "test", "source": {"count": 4, "nonce": uuid.uuid4().hex}}
    )
    replies = parallel(lambda i: send(deployment.services.urls["check"], event), 3)
    assert [r[0] for r in replies] == [200, 200, 200]
    assert {json.dumps(r[1].get_data(), sort_keys=True) for r in replies} == {
        json.dumps(replies[0][1].get_data(), sort_keys=True)
    }
    assert replies[0][1].get_data()["versions"] == [{"ref": str(i)} for i in range(1, 5)]
    status, later, _ = send(deployment.services.urls["check"], event)
    assert status == 200 and later.get_data() == replies[0][1].get_data()
    assert len(new_jobs(deployment, before, "check")) == 1


def test_the_functions_token_has_only_the_shipped_role(deployment):
    def can(*args: str) -> bool:
        out = deployment.cluster.kubectl(
            "auth", "can-i", *args, check=False, kubeconfig=deployment.kubeconfig
        )
        return out.strip() == "yes"

    ns = ("-n", deployment.namespace)
    assert can("create", "jobs.batch", *ns) and can("watch", "pods", *ns)
    assert can("create", "secrets", *ns) and can("delete", "jobs.batch", *ns)
    assert not can("list", "secrets", *ns)
    assert not can("list", "secrets", "--all-namespaces")
    # In their own namespace (the store, cache and sender Secrets) they touch no Secret.
    for verb in ("get", "delete", "create", "list"):
        assert not can(verb, "secrets", "-n", "resource-functions"), verb
    # Warm check pods (docs/warm-checks.md): created and deleted in the task namespace
    # alone, never changed; their checks go to their agents, never through pods/exec.
    # (kubectl reads "pods/exec" as a pod named exec: a subresource is asked for so.)
    assert can("create", "pods", *ns)
    assert not can("create", "pods", "--subresource=exec", *ns)
    assert not can("update", "pods", *ns) and not can("patch", "pods", *ns)
    assert not can("create", "pods", "-n", "default")
    assert not can("create", "pods", "--subresource=exec", "-n", "resource-functions")
    assert not can("update", "jobs.batch", *ns)
    assert not can("create", "jobs.batch", "-n", "default")
    denied = deployment.cluster.run_kubectl(
        "get", "secrets", "-A", kubeconfig=deployment.kubeconfig
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    whoami = deployment.cluster.kubectl(
        "auth", "whoami", "-o", "json", kubeconfig=deployment.kubeconfig
    )
    assert json.loads(whoami)["status"]["userInfo"]["username"] == (
        "system:serviceaccount:resource-functions:resource-functions"
    )


PROBE_NETWORK = (
    "ip route; cat /etc/resolv.conf; nslookup kubernetes.default.svc.cluster.local; "
    "nslookup example.com || echo external-refused"
)


def test_task_pods_reach_nothing_but_this_machine(deployment):
    """The pods' network: the subnet's and the Service range's routes, no default route, and
    the only name server is this machine's bridge address (CoreDNS), which resolves cluster
    names and nothing else."""
    from testbed.kubernetes import GATEWAY

    logs = pod_output(deployment.cluster, deployment_image(deployment), PROBE_NETWORK)
    assert not any(line.startswith("default") for line in logs.splitlines()), logs
    assert "10.244.0.0/24" in logs
    assert "10.96.0.0/24 via 10.244.0.1" in logs
    assert [line.split()[1] for line in logs.splitlines() if line.startswith("nameserver")] == [
        GATEWAY
    ]
    assert "Address: 10.96.0.1" in logs or "Address 1: 10.96.0.1" in logs, logs
    assert "external-refused" in logs, logs


def deployment_image(deployment) -> str:
    types = json.loads(deployment.services.env["RESOURCE_TYPES"])
    return types["test"]


def pod_output(cluster, image: str, script: str, token: bool = False) -> str:
    """Run ``script`` (sh) in a pod of ``image``; its output. ``token``: with the namespace's
    default ServiceAccount token mounted."""
    from tests.cluster.conftest import NAMESPACE

    return run_pod(cluster, NAMESPACE, image, ["sh", "-c", script], timeout=60, token=token)


# Not the name of Knative's identity for the check Trigger: with authentication-oidc on,
# Knative makes that account itself and will not take one it did not make (an account of that
# name left here kept the sender-auth module's Trigger from ever becoming Ready).
ALLOWED_SENDER = "allowed-sender"
AUDIENCE = "resource-functions"


def post_from_pod(url: str, token: str = "") -> str:
    """A shell script posting a check request to ``url`` (busybox wget), optionally with a
    bearer token read from a file; prints the answer's status line."""
    headers = " ".join(
        f"--header '{h}'"
        for h in (
            "Ce-Specversion: 1.0",
            f"Ce-Id: pod-{uuid.uuid4().hex[:8]}",
            "Ce-Type: dev.resourcefunctions.check.requested",
            "Ce-Source: /a/pod",
            "Content-Type: application/json",
        )
    )
    auth = f'--header "Authorization: Bearer $(cat {token})"' if token else ""
    body = json.dumps({"type": "test", "source": {"from": "a pod"}})
    return f"wget -S -O- {headers} {auth} --post-data '{body}' {url}/ 2>&1 | grep HTTP/"


@pytest.fixture
def sender_accounts(deployment):
    """The allowed sender's and an intruder's ServiceAccounts, deleted after the test."""
    from tests.cluster.conftest import NAMESPACE

    accounts = (ALLOWED_SENDER, "intruder")
    for account in accounts:
        deployment.cluster.kubectl(
            "-n", NAMESPACE, "create", "serviceaccount", account, check=False
        )
    yield accounts
    for account in accounts:
        deployment.cluster.kubectl(
            "-n", NAMESPACE, "delete", "serviceaccount", account, check=False
        )


def test_with_a_sender_audience_only_allowed_identities_may_send(
    deployment, sender_accounts, tmp_path
):
    """SENDER_AUDIENCE against the real API server, under knative/sender-auth/'s RBAC: a token
    of an allowed identity for the audience is accepted (TokenReview), a pod posting straight
    to the function is refused, with or without its own token, and so are other identities
    and other audiences; nothing runs for a refused request."""
    from testbed.kubernetes import GATEWAY
    from tests.cluster.conftest import NAMESPACE, REPO
    from tests.support.services import start_services

    cluster = deployment.cluster
    cluster.kubectl("apply", "-f", str(REPO / "knative/sender-auth/tokenreview-rbac.yaml"))
    env = {
        **deployment.services.env,
        "SENDER_AUDIENCE": AUDIENCE,
        "ALLOWED_SENDERS": f"system:serviceaccount:{NAMESPACE}:{ALLOWED_SENDER}",
    }
    services = start_services(env, tmp_path / "services.log", ("check",), host=GATEWAY)
    url = services.urls["check"]

    def token(account: str, audience: str = AUDIENCE) -> dict[str, str]:
        minted = cluster.kubectl(
            "-n", NAMESPACE, "create", "token", account, f"--audience={audience}"
        )
        return {"Authorization": f"Bearer {minted.strip()}"}

    def check(headers: dict[str, str]) -> tuple[int, object]:
        event = request_event("check", {"type": "test", "source": {"n": uuid.uuid4().hex}})
        status, reply, response = send(url, event, headers=headers)
        return status, reply or response.json()

    before = job_names(deployment, "check")
    try:
        allowed = token(ALLOWED_SENDER)

        # The ClusterRoleBinding reaches the API server's authorizer within moments.
        def reviewed() -> tuple[int, object] | None:
            answer = check(allowed)
            return None if answer[0] == 503 else answer

        status, reply = wait_until(reviewed, "a reviewed request answered", 30, interval=0.3)
        assert status == 200 and reply.get_type() == "dev.resourcefunctions.check.succeeded"
        assert check({})[0] == 401
        assert check(token(ALLOWED_SENDER, audience="somebody-else"))[0] == 401
        status, refused = check(token("intruder"))
        assert status == 403 and "intruder" in refused["error"]["message"]
        assert check({"Authorization": "Bearer not-a-token"})[0] == 401
        # A pod on the cluster network, straight to the function: refused, also with its own
        # ServiceAccount token (issued for the API server, not for the functions).
        image = deployment_image(deployment)
        assert "401" in pod_output(cluster, image, post_from_pod(url))
        mounted = "/var/run/secrets/kubernetes.io/serviceaccount/token"
        assert "401" in pod_output(cluster, image, post_from_pod(url, mounted), token=True)
        assert len(new_jobs(deployment, before, "check")) == 1  # the allowed request's alone
        log = services.log_path.read_text()
        assert "Bearer" not in log and allowed["Authorization"][7:] not in log
    finally:
        services.stop()


def everything_readable(deployment) -> dict[str, str]:
    """Where a leaked credential could show: the store, the services' log, the task pods'
    logs and specs, and Kubernetes events."""
    ns = deployment.namespace
    store = deployment.store
    return {
        "store": "\n".join(
            read_object(store, key).decode("utf-8", "replace") for key in store.list("")
        ),
        "service log": deployment.services.log_path.read_text(errors="replace"),
        "task logs": deployment.cluster.kubectl(
            "-n",
            ns,
            "logs",
            "-l",
            "app.kubernetes.io/managed-by=resource-functions",
            "--all-containers",
            "--tail=-1",
            check=False,
        ),
        "pods": deployment.cluster.kubectl("-n", ns, "get", "pods", "-o", "json"),
        "events": deployment.cluster.kubectl("get", "events", "-A", "-o", "json", check=False),
    }


def test_what_a_hostile_resource_leaves_is_data_and_the_store_credentials_are_nowhere(
    deployment,
):
    """The resource image turns what collect reads into links to /proc/self/environ (or
    /proc/self), a FIFO or a 10 GiB sparse file: each run ends in a clean failure naming the
    file, and the store's credentials (mounted as files into stage and collect alone, never
    env vars) appear in no reply, stored object, log, pod spec or event."""
    cases = [  # action, target, as, (kind, in the message)
        ("check", "stderr", "link", ("runtime", "stderr is a symbolic link")),
        ("check", "stdout", "fifo", ("runtime", "stdout is a FIFO")),
        ("check", ".task", "link", ("runtime", ".task is a symbolic link")),
        ("get", "get", "link", ("invalid_output", "output directory is a symbolic link")),
        ("check", "stderr", "sparse", None),
    ]

    def run(i: int):
        action, target, kind, _ = cases[i]
        source = {"password": CANARY, "mode": "hostile", "target": target, "as": kind}
        data = {"type": "test", "source": {**source, "nonce": uuid.uuid4().hex}}
        if action == "get":
            data["version"] = {"ref": "1"}
        return send(deployment.services.urls[action], request_event(action, data))

    answers = parallel(run, len(cases))
    for (*_, expected), (status, reply, response) in zip(cases, answers, strict=True):
        assert status == 200, response.text
        data = reply.get_data()
        if expected is None:
            assert "error" not in data, data
        else:
            assert data["error"]["kind"] == expected[0], data
            assert expected[1] in data["error"]["message"], data
    secret_key = deployment.s3.env["AWS_SECRET_ACCESS_KEY"]
    for where, text in everything_readable(deployment).items():
        assert secret_key not in text, where
        assert CANARY not in text, where


def test_a_pair_reused_for_another_request_is_refused_and_never_attaches_to_its_job(
    deployment,
):
    """The run's Job carries the request's digest: a later request reusing the event's
    (source, id) for other data is 400 while the first still runs and after it is done,
    and a redelivery of the first (the same request) replays its answer."""
    source = {**SOURCE, "nonce": uuid.uuid4().hex, "delay": 3}
    first = request_event("check", {"type": "test", "source": source})
    other = CloudEvent(
        attributes=first.get_attributes(), data={"type": "test", "source": {**source, "count": 1}}
    )
    url = deployment.services.urls["check"]
    run = run_of(
        deployment.services.env["CACHE_SECRET"], first.get_source(), first.get_id(), "check"
    )
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(send(url, first)))
    thread.start()
    [job] = wait_until(lambda: deployment.jobs(**{f"{LABEL}run-id": run}), "the Job", 60)
    assert job["metadata"]["annotations"][f"{LABEL}request"]
    during = send(url, other)
    thread.join(120)
    after = send(url, other)
    again = send(url, first)

    assert during[0] == 400 and "event id reused" in during[2].text
    assert after[0] == 400 and "event id reused" in after[2].text
    [(status, reply, _)] = answers
    assert status == 200 and again[0] == 200
    assert again[1].get_data() == reply.get_data()
    assert len(deployment.jobs(**{f"{LABEL}run-id": run})) == 1
