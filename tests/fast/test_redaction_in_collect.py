"""The findings of issue 18, through the task pod's ``collect`` step as it runs (files left
by the resource step, the stdin Secret's files, a file store): the log is cut after it is
redacted, every covered form goes, overlapping secrets leave nothing, short values and
short lines are never substituted, metadata is redacted and a version holding a secret
fails the run. The values to redact sit beside stdin, as the function writes them."""

from __future__ import annotations

import base64
import json
import shlex
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest

from functions import keys
from functions.protocol import MAX_STDERR_BYTES
from functions.steps.pod_contract import CollectStep
from functions.task import in_pod
from functions.task.step_settings import StepSettings
from storage import get_json, open_store

RUN = "7" * 32
SECRET = "p@ss/w+rd='é'\"x\\-4f1d"  # every character that encoders treat specially
RESOLVED = [SECRET]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir()
    return tmp_path / "store"


def collect(
    tmp_path: Path,
    store_dir: Path,
    stderr: bytes,
    *,
    stdout: str = "[]",
    values: list[str] = RESOLVED,
    resolved: list[str] | None = None,
    action: str = "check",
    exit_code: int = 0,
) -> tuple[dict[str, Any], str]:
    """Run collect on what a resource step left; the result record and the stored log.
    ``values``: to redact; ``resolved``: the resolved credential values (default: all)."""
    task = tmp_path / "build/.task"
    task.mkdir(parents=True, exist_ok=True)
    (task / "exit-code").write_text(f"{exit_code}\n")
    (task / "stdout").write_text(stdout)
    (task / "stderr").write_bytes(stderr)
    (tmp_path / "stdin").write_text(json.dumps({"source": {}}))
    (tmp_path / "redact").write_text(json.dumps(values))
    (tmp_path / "resolved").write_text(json.dumps(values if resolved is None else resolved))
    step = CollectStep(
        run_id=RUN,
        action=action,  # type: ignore[arg-type]
        build_dir=str(tmp_path / "build"),
        stdin_file=str(tmp_path / "stdin"),
    )
    assert in_pod.collect_main(step, StepSettings(store_url=store_dir.as_uri())) == 0
    store = open_store(store_dir.as_uri())
    with store.open(keys.log_key(RUN)) as stream:
        log = stream.read().decode()
    return get_json(store, keys.result_key(RUN)), log


def test_a_secret_cut_by_the_log_s_tail_leaves_no_part_of_it(
    tmp_path: Path, store_dir: Path
) -> None:
    # The tail the log keeps starts 6 bytes before the end of the secret.
    stderr = b"cloning\n" + SECRET.encode() + b"x" * (MAX_STDERR_BYTES - 6)
    _, log = collect(tmp_path, store_dir, stderr)
    assert log.startswith("[redacted]x") and len(log) == MAX_STDERR_BYTES - 6 + 10
    assert SECRET.encode()[-6:].decode() not in log


def b64(data: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


FORMS = {
    "percent-encoded": quote(SECRET, safe=""),
    "form-encoded": quote_plus(SECRET),
    "base64": b64(SECRET.encode()),
    "base64 after 1 byte": b64(b":" + SECRET.encode()),
    "base64 after 2 bytes": b64(b"ab" + SECRET.encode() + b"!"),
    "base64 of user:password": b64(b"ci:" + SECRET.encode()),
    "url-safe base64 after 1 byte": b64(b"u" + SECRET.encode() + b"!!", urlsafe=True),
    "shell quotes": shlex.quote(SECRET)[1:-1],
    "python repr": repr(SECRET)[1:-1],
    "json twice": json.dumps(json.dumps(SECRET))[3:-3],
    "json three times": json.dumps(json.dumps(json.dumps(SECRET)))[7:-7],
    "hex": SECRET.encode().hex(),
    "NFD": unicodedata.normalize("NFD", SECRET),
    "folded": SECRET[:9] + "\n" + SECRET[9:],
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_each_form_of_a_secret_is_redacted(tmp_path: Path, store_dir: Path, form: str) -> None:
    assert form != SECRET and SECRET not in form
    _, log = collect(tmp_path, store_dir, f"before {form} after\n".encode())
    assert form[4:-4] not in log  # base64: the ends hold bits of the neighbours too
    assert log.startswith("before ") and log.endswith(" after\n") and "[redacted]" in log
    assert len(log) <= len("before [redacted] after\n") + 8  # base64: the neighbours' bits


def test_the_log_tail_s_progress_collapse_shows_redacted_states_only(
    tmp_path: Path, store_dir: Path
) -> None:
    header = "Authorization: Basic " + b64(f"ci:{SECRET}".encode())
    progress = "".join(f"\rReceiving objects: {n}% {header}" for n in range(0, 101, 25))
    stderr = f"Cloning...\n{progress}\nfatal: Authentication failed\n".encode()
    result, _ = collect(tmp_path, store_dir, stderr, exit_code=128)
    tail = result["error"]["log_tail"]
    assert tail == (
        "Cloning...\nReceiving objects: 100% Authorization: Basic Y2k6[redacted]==\n"
        "fatal: Authentication failed\n"
    )


def test_overlapping_secrets_leave_nothing(tmp_path: Path, store_dir: Path) -> None:
    values = ["abcd-secret-1234", "1234-other-5678"]
    _, log = collect(tmp_path, store_dir, b"<abcd-secret-1234-other-5678>\n", values=values)
    assert log == "<[redacted]>\n"


def test_a_one_letter_credential_is_not_substituted(tmp_path: Path, store_dir: Path) -> None:
    _, log = collect(tmp_path, store_dir, b"Cloning repository\n", values=["e"])
    assert log == "Cloning repository\n"


def test_short_and_punctuation_lines_of_a_multi_line_value_stay(
    tmp_path: Path, store_dir: Path
) -> None:
    value = '{\n  "private_key": "k3y-material-0f9e"\n}'
    log_text = 'config {\n  "private_key": "k3y-material-0f9e",\n  "n": 1\n}\nok: {}\n'
    _, log = collect(tmp_path, store_dir, log_text.encode(), values=[value])
    assert log == 'config {\n[redacted],\n  "n": 1\n}\nok: {}\n'


def test_a_multi_line_value_is_redacted_whole(tmp_path: Path, store_dir: Path) -> None:
    value = '{\n  "private_key": "k3y-material-0f9e"\n}'
    _, log = collect(tmp_path, store_dir, f"whole: {value}.".encode(), values=[value])
    assert log == "whole: [redacted]."


def test_metadata_values_are_redacted(tmp_path: Path, store_dir: Path) -> None:
    stdout = json.dumps(
        {
            "version": {"ref": "v1"},
            "metadata": [
                {"name": "url", "value": f"https://ci:{quote(SECRET, safe='')}@git/r"},
                {"name": "author", "value": "someone", "type": "person"},
                {"name": "x", "value": "y", "type": f"t-{SECRET}", f"k-{SECRET}": "z"},
            ],
        }
    )
    result, _ = collect(tmp_path, store_dir, b"", stdout=stdout, action="put")
    assert result["data"]["metadata"] == [
        {"name": "url", "value": "https://ci:[redacted]@git/r"},
        {"name": "author", "value": "someone", "type": "person"},
        {"name": "x", "value": "y", "type": "t-[redacted]", "k-[redacted]": "z"},
    ]


@pytest.mark.parametrize("shown", [SECRET, b64(SECRET.encode()), quote(SECRET, safe="")])
def test_a_version_holding_a_secret_fails_the_run_naming_the_field(
    tmp_path: Path, store_dir: Path, shown: str
) -> None:
    versions = [{"ref": "1"}, {"ref": "2", "token": f"x{shown}y"}]
    result, _ = collect(tmp_path, store_dir, b"", stdout=json.dumps(versions))
    error = result["error"]
    assert error["kind"] == "invalid_output"
    assert 'versions[1] field "token"' in error["message"]
    assert shown not in json.dumps(result) and "data" not in result


def test_a_literal_secret_in_a_version_does_not_fail_the_run(
    tmp_path: Path, store_dir: Path
) -> None:
    # Only resolved credentials are hidden from versions: a literal value is in the
    # pipeline's own text already (and its log lines are redacted all the same).
    versions = [{"ref": "1", "tag": SECRET}]
    result, _ = collect(tmp_path, store_dir, b"", stdout=json.dumps(versions), resolved=[])
    assert result["data"]["versions"] == versions
