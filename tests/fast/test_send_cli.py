"""``resource-functions send`` (functions/cli/send.py): one request event to a sink, as a
scheduled check's CronJob posts it; against the loopback event sink."""

from __future__ import annotations

import io
import json

import pytest

from functions.cli.commands import main
from functions.cli.launch import free_port
from functions.cli.send import send
from functions.errors import SinkRefused


def test_send_posts_one_request_event_with_the_callers_id_and_subject(sink, capsys) -> None:
    data = {"type": "git", "source": {"uri": "git://git.example/app.git"}}
    args = ["send", "check", json.dumps(data), "--id", "tick-1", "--subject", "pipelines/t/app"]
    assert main([*args, "--sink", sink.url]) == 0
    (event,) = sink.wait(id="tick-1", timeout=10)
    attributes = event.get_attributes()
    assert attributes["type"] == "dev.resourcefunctions.check.requested"
    assert attributes["source"] == "/resource-functions/cli"
    assert attributes["subject"] == "pipelines/t/app"
    assert event.get_data() == data
    assert "posted dev.resourcefunctions.check.requested tick-1" in capsys.readouterr().out


def test_send_takes_k_sink_from_the_environment_and_a_new_id(sink, monkeypatch) -> None:
    monkeypatch.setenv("K_SINK", sink.url)
    assert main(["send", "get", '{"type": "git", "source": {}, "version": {"ref": "a"}}']) == 0
    (event,) = sink.wait(type="dev.resourcefunctions.get.requested", timeout=10)
    assert len(event.get_id()) == 36 and "subject" not in event.get_attributes()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["[1, 2]", "--sink", "http://127.0.0.1:9"], "DATA must be a JSON object"),
        (["{}"], "no sink: pass --sink or set K_SINK"),
    ],
)
def test_send_refuses_what_cannot_be_a_request(args, said, capsys, monkeypatch) -> None:
    monkeypatch.delenv("K_SINK", raising=False)
    assert main(["send", "check", *args]) == 2
    assert said in capsys.readouterr().err


def test_send_says_so_when_the_sink_does_not_take_it() -> None:
    sink = f"http://127.0.0.1:{free_port()}/"  # nothing listens
    with pytest.raises(SinkRefused, match=f"sink {sink} unreachable"):
        send("check", {"type": "git", "source": {}}, sink=sink, out=io.StringIO(), attempts=1)


def test_send_refuses_data_that_is_not_json() -> None:
    with pytest.raises(SystemExit, match="DATA: not valid JSON"):
        main(["send", "check", "{nope", "--sink", "http://127.0.0.1:9"])
