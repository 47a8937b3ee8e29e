"""Redaction end to end on the local runtime: real services under gunicorn, real containers
under Podman, CREDENTIALS_DIR as the provider. The test resource prints a resolved secret
in every covered form to stderr and into metadata (forms made by tests/support/secret_forms.py),
and a version holding it; it prints a log whose 4 MiB tail starts inside a secret; and it
prints literal values of its source, secret-named and not."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from tests.support.engine import service_env
from tests.support.events import request_event, send
from tests.support.secret_forms import HOSTILE, printed_forms, survivors
from tests.support.services import CANARY, start_services

BUILD = {"team": "main", "pipeline": "p", "id": "1"}
URL = "https://git.example.com/team/repo.git"


@pytest.fixture(scope="module")
def deployment(docker_host, resource_image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redaction")
    creds = tmp / "credentials"
    (creds / "teams" / "main" / "git").mkdir(parents=True)
    (creds / "teams" / "main" / "git" / "password").write_text(HOSTILE + "\n")
    env = {
        **service_env(docker_host, resource_image, tmp),
        "CACHE_SECRET": "e2e-cache-secret",
        "CREDENTIALS_DIR": str(creds),
        "ALLOWED_IMAGES": "",
    }
    services = start_services(env, tmp / "services.log", actions=("check", "get"))
    try:
        yield services, tmp / "store"
    finally:
        services.stop()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def run(services, action: str, source: dict, **data) -> tuple[dict, str]:
    event = request_event(action, {"type": "test", "build": BUILD, "source": source, **data})
    status, reply, response = send(services.urls[action], event)
    assert status == 200, response.text
    return reply.get_data(), response.text


def stored_logs(store: Path) -> str:
    time.sleep(0.2)
    return "\n".join(path.read_text() for path in (store / "logs").glob("*.log"))


def test_every_form_of_a_resolved_secret_leaves_the_log_and_the_metadata(deployment):
    services, store = deployment
    forms = printed_forms(HOSTILE)
    stderr = f"cloning {URL} at feature/login-form\n" + "".join(
        f"form {name}: {text} (end)\n" for name, (text, _) in forms.items()
    )
    metadata = [{"name": name, "value": f"<{text}>"} for name, (text, _) in forms.items()]
    stdout = json.dumps({"version": {"ref": "1"}, "metadata": metadata})
    source = {
        "mode": "forms",
        "password": "((git.password))",
        "stderr_b64": b64(stderr),
        "stdout_b64": b64(stdout),
    }
    data, text = run(services, "get", source, version={"ref": "1"})
    assert "error" not in data, data
    shown = data["metadata"]
    assert [m["name"] for m in shown] == list(forms)
    for item in shown:
        assert "[redacted]" in item["value"] and not survivors(item["value"], HOSTILE), item
    assert not survivors(text, HOSTILE)
    log = stored_logs(store)
    assert f"cloning {URL} at feature/login-form\n" in log
    for name in forms:
        line = next(x for x in log.splitlines() if x.startswith(f"form {name}: "))
        assert "[redacted]" in line and line.endswith(" (end)"), line
    assert not survivors(log, HOSTILE)


def test_a_version_holding_a_resolved_secret_fails_naming_the_field(deployment):
    services, _ = deployment
    token = base64.b64encode(f"ci:{HOSTILE}".encode()).decode()
    stdout = json.dumps({"version": {"ref": "2", "auth": token}, "metadata": []})
    source = {"mode": "forms", "password": "((git.password))", "stdout_b64": b64(stdout)}
    data, text = run(services, "get", source, version={"ref": "2"})
    error = data["error"]
    assert error["kind"] == "invalid_output"
    assert 'version field "auth"' in error["message"]
    assert token[4:-4] not in text and not survivors(text, HOSTILE)


LITERALS = {
    "password": "p4s5w",  # five characters: under the old six-character floor
    "private_key": "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n-----END KEY-----",
    "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
    "access_token": "ghp_16C7e42F292c6912E7710c838347",
    "credentials": "svc-account:hunter22",
}


def test_literal_values_are_redacted_only_under_secret_named_keys(deployment):
    services, store = deployment
    readable = {
        "uri": URL,
        "branch": "feature/login-form",
        "message": "the repository is archived, ask the owners",
    }
    lines = [f"{key}={value}" for key, value in {**readable, **LITERALS}.items()]
    lines.append(f"remote: https://ci:{CANARY}@git.example.com/r.git")
    source = {
        **readable,
        **LITERALS,
        "mirror": f"https://ci:{CANARY}@git.example.com/r.git",
        "mode": "forms",
        "exit_code": 3,
        "stderr_b64": b64("\n".join(lines) + "\n"),
    }
    data, text = run(services, "check", source)
    tail = data["error"]["log_tail"]
    assert f"uri={URL}\n" in tail and "branch=feature/login-form\n" in tail
    assert "message=the repository is archived, ask the owners\n" in tail
    assert "remote: https://[redacted]@git.example.com/r.git" in tail
    for key, value in LITERALS.items():
        assert f"{key}=[redacted]" in tail, key
        assert all(line not in text for line in value.splitlines() if len(line) > 4), key
    assert CANARY not in text and CANARY not in stored_logs(store)


def test_a_secret_cut_by_the_log_s_4_mib_tail_leaves_nothing(deployment):
    services, store = deployment
    source = {"mode": "straddle", "password": CANARY, "keep": 6}
    data, _ = run(services, "check", source)
    assert "versions" in data, data
    logs = [path.read_bytes() for path in (store / "logs").glob("*.log")]
    straddled = [log for log in logs if log.endswith(b"x" * 1000)]
    assert len(straddled) == 1
    assert straddled[0].startswith(b"[redacted]xxx"), straddled[0][:40]
    assert CANARY[-6:].encode() not in straddled[0]
