"""check, get and put end to end: real services under gunicorn, real CloudEvents over HTTP,
real containers under Podman, artifacts in the real S3 server / GCS emulator / a directory."""

from __future__ import annotations

import io
import json
import os
import stat
import time
import uuid
from pathlib import Path

import docker
import pytest
import zstandard

from storage.archive import format_for_key, unpack
from storage.artifacts import add_team
from storage.base import key_for_url
from tests.support.events import request_event, send
from tests.support.parallel import parallel
from tests.support.round_trip import get_new_version, put_across_teams, put_fetched
from tests.support.runs import run_of
from tests.support.services import CANARY, E2E_CACHE_SECRET

SOURCE = {"uri": "https://git.example.com/repo.git", "password": CANARY}


def runs(deployment, action):
    return deployment.services.metric(action, "resource_function_runs_total")


def key_of(deployment, url):
    key = key_for_url(deployment.store, url)
    assert key is not None, url
    return key


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_check_returns_versions_in_both_content_modes(deployment, mode):
    event = request_event("check", {"type": "test", "source": SOURCE}, subject="main/repo")
    status, reply, _ = send(deployment.services.urls["check"], event, mode)
    assert status == 200
    assert reply.get_type() == "dev.resourcefunctions.check.succeeded"
    assert reply.get_extension("requestid") == event.get_id()
    assert reply.get_subject() == "main/repo"
    assert reply.get_data()["versions"] == [{"ref": "1"}, {"ref": "2"}, {"ref": "3"}]


def test_check_from_a_version_and_null_output(deployment):
    url = deployment.services.urls["check"]
    _, reply, _ = send(
        url, request_event("check", {"type": "test", "source": SOURCE, "version": {"ref": "2"}})
    )
    assert reply.get_data()["versions"] == [{"ref": "2"}, {"ref": "3"}]
    _, reply, _ = send(url, request_event("check", {"type": "test", "source": {"mode": "empty"}}))
    assert reply.get_data()["versions"] == []


def test_a_check_records_its_history_and_continues_from_it(deployment):
    url = deployment.services.urls["check"]
    source = {"count": 3, "nonce": uuid.uuid4().hex}

    def check(**data):
        status, reply, _ = send(
            url, request_event("check", {"type": "test", "source": source, **data})
        )
        assert status == 200, reply
        return reply.get_data()

    assert check(version={"ref": "2"}) == {
        "versions": [{"ref": "2"}, {"ref": "3"}],
        "new": [{"ref": "2"}, {"ref": "3"}],
    }
    # latest-known: the script got ref 3 (else it would print 1..3) and found nothing new
    assert check(version="latest-known") == {"versions": [{"ref": "3"}], "new": []}
    assert check()["new"] == [{"ref": "1"}]


def test_pingsource_tick_runs_a_check(deployment):
    event = request_event(
        "check",
        {"type": "test", "source": {"count": 1}},
        source="/apis/v1/namespaces/ci/pingsources/every-5m",
    )
    tick = type(event)(
        attributes={**event.get_attributes(), "type": "dev.knative.sources.ping"},
        data=event.get_data(),
    )
    status, reply, _ = send(deployment.services.urls["check"], tick)
    assert status == 200 and reply.get_type() == "dev.resourcefunctions.check.succeeded"
    assert reply.get_data()["versions"] == [{"ref": "1"}]


def test_get_stores_the_directory_and_a_repeat_is_a_cache_hit(deployment, tmp_path):
    data = {
        "type": "test",
        "source": SOURCE,
        "version": {"ref": f"v-{uuid.uuid4().hex[:8]}"},
        "params": {"kib": 300},
        "build": {"id": "77", "pipeline": "main", "job": "unit"},
    }
    before, first = runs(deployment, "get"), request_event("get", data)
    status, reply, _ = send(deployment.services.urls["get"], first)
    assert status == 200, reply and reply.get_data()
    # At most one start in Podman's event log, which may miss one (libpod writes events after
    # the fact and has been seen to drop some, containers/podman#10219); that the get ran
    # exactly once is the service's run count, checked below.
    assert container_starts(deployment, first, at_least=1) <= 1
    body = reply.get_data()
    assert body["version"] == data["version"] and body["cached"] is False
    assert body["metadata"] == [{"name": "build", "value": "77"}]
    artifact = body["artifact"]
    key = key_of(deployment, artifact["url"])
    raw = read_object(deployment.store, key)
    assert artifact["size"] == len(raw)
    assert artifact["digest"] == "sha256:" + __import__("hashlib").sha256(raw).hexdigest()
    unpack(
        io.BytesIO(raw), tmp_path, format=format_for_key(key), expected_digest=artifact["digest"]
    )
    assert (tmp_path / "version").read_text() == data["version"]["ref"] + "\n"
    assert (tmp_path / "sub/build.txt").read_text() == "build 77 of main/unit\n"
    assert os.readlink(tmp_path / "sub/version-link") == "../version"
    assert (tmp_path / "sub/empty-dir").is_dir()
    assert stat.S_IMODE((tmp_path / "sub/run.sh").stat().st_mode) & 0o111
    assert (tmp_path / "blob").stat().st_size == 300 * 1024
    assert runs(deployment, "get") == before + 1

    second = request_event("get", data)
    status, again, _ = send(deployment.services.urls["get"], second)
    assert status == 200
    assert again.get_data() == {**body, "cached": True}
    assert runs(deployment, "get") == before + 1
    assert container_starts(deployment, second) == 0
    assert deployment.services.metric("get", "resource_function_cache_hits_total") >= 1


def test_get_output_links_are_stored_as_links_never_read_through(deployment, tmp_path):
    data = {"type": "test", "source": {"mode": "escape"}, "version": {"ref": uuid.uuid4().hex}}
    status, reply, _ = send(deployment.services.urls["get"], request_event("get", data))
    assert status == 200 and reply.get_type() == "dev.resourcefunctions.get.succeeded", reply
    key = key_of(deployment, reply.get_data()["artifact"]["url"])
    raw = read_object(deployment.store, key)
    unpack(io.BytesIO(raw), tmp_path, format=format_for_key(key))
    assert os.readlink(tmp_path / "evil") == "/etc/passwd"
    assert os.readlink(tmp_path / "sub/up") == ".."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil", "sub", "version"]
    tar = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    assert Path("/etc/passwd").read_bytes() not in tar  # nothing of the host's was read


def test_get_output_holding_a_fifo_is_refused_naming_it(deployment):
    data = {"type": "test", "source": {"mode": "fifo"}, "version": {"ref": "f"}}

    def stored() -> set[str]:  # artifacts and cache records (a get records its team before)
        return {k for k in deployment.store.list("artifacts/") if not k.endswith(".teams.json")}

    artifacts = stored()
    status, reply, _ = send(deployment.services.urls["get"], request_event("get", data))
    assert status == 200 and reply.get_type() == "dev.resourcefunctions.get.failed"
    error = reply.get_data()["error"]
    assert error["kind"] == "invalid_output" and "'sub/pipe': a FIFO" in error["message"]
    assert stored() == artifacts  # nothing half-stored


def test_put_receives_the_artifact_of_a_get(deployment):
    urls = deployment.services.urls
    put_fetched(urls, SOURCE, get_new_version(urls, SOURCE, "p"))


def test_a_put_of_another_teams_artifact_is_403_and_starts_no_container(deployment):
    puts = put_across_teams(deployment.services.urls, SOURCE, lambda: runs(deployment, "put"))
    assert puts.after_refusal == puts.before
    assert puts.after == puts.before + 1  # team a's put alone started a container


def test_put_with_a_missing_input_fails_as_storage(deployment):
    # An artifact of this team (no team) that has gone: the put runs and its stage fails.
    add_team(deployment.store, "artifacts/nope.tar.zst", "")
    data = {
        "type": "test",
        "source": SOURCE,
        "params": {"input": "repo"},
        "inputs": {"repo": deployment.store.url_for("artifacts/nope.tar.zst")},
    }
    status, reply, _ = send(deployment.services.urls["put"], request_event("put", data))
    assert status == 200
    assert reply.get_data()["error"]["kind"] == "storage"
    assert "does not exist" in reply.get_data()["error"]["message"]


@pytest.mark.parametrize(
    "source, kind, detail",
    [
        pytest.param(
            {"mode": "fail", "password": CANARY},
            "resource_failed",
            "exited with code 3",
            id="exit-3",
        ),
        pytest.param(
            {"mode": "malformed"}, "invalid_output", "stdout is not JSON", id="malformed-stdout"
        ),
        pytest.param(
            {"mode": "badversion"},
            "invalid_output",
            "versions[0].ref must be a string",
            id="non-string-version",
        ),
    ],
)
def test_resource_failures_are_failed_events(deployment, source, kind, detail):
    status, reply, _ = send(
        deployment.services.urls["check"],
        request_event("check", {"type": "test", "source": source}),
    )
    assert status == 200
    assert reply.get_type() == "dev.resourcefunctions.check.failed"
    error = reply.get_data()["error"]
    assert error["kind"] == kind and detail in error["message"]
    if kind == "resource_failed":
        assert error["exit_code"] == 3
        assert "cannot reach the repository" in error["log_tail"]
        assert CANARY not in error["log_tail"] and "[redacted]" in error["log_tail"]


def test_timeout_kills_the_container(deployment):
    event = request_event("check", {"type": "slow", "source": {"mode": "slow", "seconds": 60}})
    status, reply, _ = send(deployment.services.urls["check"], event)
    assert status == 200
    assert reply.get_data()["error"]["kind"] == "timeout"
    assert removed_soon(deployment, event)


def test_missing_image_is_an_image_pull_failure(deployment):
    status, reply, _ = send(
        deployment.services.urls["check"], request_event("check", {"type": "missing", "source": {}})
    )
    assert status == 200
    assert reply.get_data()["error"]["kind"] == "image_pull"


@pytest.mark.parametrize(
    "action, data, problem",
    [
        pytest.param("check", {"source": {}}, "exactly one of 'type'", id="no-type"),
        pytest.param(
            "get", {"type": "test", "source": {}}, "'version' is required", id="get-without-version"
        ),
        pytest.param(
            "check", {"type": "nope", "source": {}}, "not in the catalogue", id="unknown-type"
        ),
        pytest.param(
            "put",
            {"type": "test", "source": {}, "inputs": {"a": "s3://elsewhere/x"}},
            "must be an artifact in this store",
            id="foreign-input",
        ),
    ],
)
def test_bad_requests_get_400_and_start_nothing(deployment, action, data, problem):
    before = runs(deployment, action)
    status, _, response = send(deployment.services.urls[action], request_event(action, data))
    assert status == 400
    assert problem in response.json()["error"]["message"]
    assert runs(deployment, action) == before


@pytest.mark.parametrize(
    "body",
    [
        "[]",
        "17",
        "null",
        (
            '{"specversion": "1.0", "type": "dev.resourcefunctions.check.requested", "source": "/t",'
            ' "id": "bad\\ud800id", "subject": "s\\udfff", "data": {"type": "test", "source": {}}}'
        ),
        '{"specversion": "1.0", "type": "dev.resourcefunctions.check.requested", "source": "/t",'
        ' "id": "deep-1", "data": {"type": "test", "source": '
        + '{"a":' * 200
        + "1"
        + "}" * 200
        + "}}",
    ],
    ids=["list", "number", "null", "lone-surrogate", "deep"],
)
def test_structured_bodies_refused_before_running(deployment, body):
    before = runs(deployment, "check")
    response = __import__("requests").post(
        deployment.services.urls["check"],
        data=body.encode(),
        timeout=30,
        headers={"content-type": "application/cloudevents+json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["kind"] == "invalid_request"
    assert runs(deployment, "check") == before


def test_non_cloudevent_and_wrong_type_get_400(deployment):
    url = deployment.services.urls["check"]
    response = __import__("requests").post(url, json={"type": "test"}, timeout=10)
    assert response.status_code == 400 and "not a CloudEvent" in response.text
    status, _, response = send(
        url, request_event("get", {"type": "test", "source": {}, "version": {"ref": "1"}})
    )
    assert status == 400 and "this is the check service" in response.json()["error"]["message"]


def test_redelivery_attaches_to_the_run_under_way_and_replays_the_result(deployment):
    event = request_event(
        "check", {"type": "test", "source": {"count": 4, "nonce": uuid.uuid4().hex}}
    )
    before = runs(deployment, "check")
    replies = parallel(lambda i: send(deployment.services.urls["check"], event), 3)
    assert [r[0] for r in replies] == [200, 200, 200]
    assert len({json.dumps(r[1].get_data()) for r in replies}) == 1
    assert runs(deployment, "check") == before + 1
    status, later, _ = send(deployment.services.urls["check"], event)
    assert status == 200 and later.get_data() == replies[0][1].get_data()
    assert runs(deployment, "check") == before + 1


def test_identical_checks_arriving_together_share_one_run(deployment):
    data = {"type": "test", "source": {"count": 2, "nonce": uuid.uuid4().hex}}
    sent = [request_event("check", data) for _ in range(3)]
    before = runs(deployment, "check")
    replies = parallel(lambda i: send(deployment.services.urls["check"], sent[i]), 3)
    assert all(r[0] == 200 for r in replies)
    assert [r[1].get_extension("requestid") for r in replies] == [e.get_id() for e in sent]
    expected = {"versions": [{"ref": "1"}, {"ref": "2"}], "new": [{"ref": "1"}, {"ref": "2"}]}
    assert all(r[1].get_data() == expected for r in replies)
    assert runs(deployment, "check") == before + 1


def test_cache_entry_whose_artifact_expired_is_fetched_again(deployment):
    data = {"type": "test", "source": {"n": uuid.uuid4().hex}, "version": {"ref": "x"}}
    _, first, _ = send(deployment.services.urls["get"], request_event("get", data))
    key = key_of(deployment, first.get_data()["artifact"]["url"])
    deployment.store.delete(key)  # as a bucket lifecycle rule would
    status, again, _ = send(deployment.services.urls["get"], request_event("get", data))
    assert status == 200 and again.get_data()["cached"] is False
    assert deployment.store.stat(key) is not None
    _, third, _ = send(deployment.services.urls["get"], request_event("get", data))
    assert third.get_data()["cached"] is True
    assert third.get_data()["artifact"] == again.get_data()["artifact"]


HOSTILE = 'pa"ss\\w\tord-é-日本-𝄞'
PIN = 7654321


def secret_forms():
    return [
        HOSTILE,
        json.dumps(HOSTILE, ensure_ascii=False)[1:-1],
        json.dumps(HOSTILE)[1:-1],
        "ord-",
        str(PIN),
    ]


def test_a_script_echoing_its_stdin_leaks_no_secret_in_any_encoding(deployment):
    source = {"mode": "echo", "password": HOSTILE, "pin_token": PIN, "lang": "é"}
    event = request_event("check", {"type": "test", "source": source})
    status, reply, _ = send(deployment.services.urls["check"], event)
    assert status == 200 and reply.get_type() == "dev.resourcefunctions.check.failed"
    tail = reply.get_data()["error"]["log_tail"]
    run = run_of(E2E_CACHE_SECRET, event.get_source(), event.get_id(), "check")
    log = read_object(deployment.store, f"logs/{run}.log").decode()
    result = read_object(deployment.store, f"results/{run}.json").decode()
    assert '"lang":"é"' in log  # stdin is UTF-8, without \u escapes, as Concourse sends it
    for text in (tail, log, result):
        assert "[redacted]" in text
        for form in secret_forms():
            assert form not in text, (form, text)


def test_canary_secret_never_leaks(deployment):
    # Runs after the others in this module: scan everything they left behind.
    send(
        deployment.services.urls["check"],
        request_event("check", {"type": "test", "source": {"mode": "fail", "password": CANARY}}),
    )
    assert CANARY not in deployment.services.log_path.read_text()
    for key in deployment.store.list(""):
        assert CANARY.encode() not in read_object(deployment.store, key), key


def read_object(store, key) -> bytes:
    with store.open(key) as stream:
        return stream.read()


def engine(deployment):
    return docker.DockerClient(base_url=deployment.services.env["DOCKER_HOST"])


def run_of_event(event) -> str:
    return run_of(
        E2E_CACHE_SECRET, event.get_source(), event.get_id(), event.get_type().split(".")[2]
    )


def leftover_containers(deployment, event):
    """This request's containers still known to the engine (labels managed-by and run-id):
    other tests and other users of the engine may have containers of their own."""
    labels = ["app.kubernetes.io/managed-by=resource-functions", f"run-id={run_of_event(event)}"]
    return engine(deployment).containers.list(all=True, filters={"label": labels})


def removed_soon(deployment, event, seconds: float = 30) -> bool:
    """Whether the request's containers are gone within ``seconds``: the service removes
    them after it has replied."""
    deadline = time.monotonic() + seconds
    while leftover_containers(deployment, event):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def container_starts(deployment, event, at_least: int = 0) -> int:
    """Containers the engine started for this request (label run-id), from the engine's event
    log (``stream=false`` makes Podman answer at once; Docker ignores it). Podman writes its
    event log a little after the fact, so ``at_least`` waits (up to 10 s) for that many."""
    deadline = time.monotonic() + 10
    while (count := _starts_logged(deployment, event)) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return count


def _starts_logged(deployment, event) -> int:
    client = engine(deployment).api
    filters = {"event": ["start"], "label": [f"run-id={run_of_event(event)}"]}
    response = client.get(
        client._url("/events"),
        stream=True,
        timeout=30,
        params={
            "since": str(int(deployment.started)),
            "until": str(int(time.time()) + 1),
            "stream": "false",
            "filters": json.dumps(filters),
        },
    )
    response.raise_for_status()
    body = b"".join(response.iter_content(65536)).decode()
    return body.count('"status":"start"')
