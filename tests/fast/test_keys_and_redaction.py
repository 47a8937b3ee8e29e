"""Cache keys reveal nothing; run ids follow the request identity; failures and log tails
say what went wrong (what redaction does: tests/test_redaction_*.py)."""

from functions import keys
from functions.protocol import stdin_payload
from functions.redaction import Redactor, secret_values
from functions.steps.outcome import log_tail, outcome_of_script

SECRET = "canary-4f1d2a9c-secret"


def key(**overrides):
    args = {"image": "img", "source": {"password": SECRET}, "version": {"v": "1"}, "params": {}}
    args.update(overrides)
    return keys.cache_key(b"k1", **args)


def test_cache_key_is_stable_and_reveals_no_source():
    assert key() == key()
    assert SECRET not in key() and len(key()) == 64


def test_cache_key_changes_with_every_input():
    variants = [
        key(image="img2"),
        key(source={"password": "other"}),
        key(version={"v": "2"}),
        key(params={"depth": 1}),
        keys.cache_key(
            b"k2", image="img", source={"password": SECRET}, version={"v": "1"}, params={}
        ),
    ]
    assert len({key(), *variants}) == 6


def test_cache_key_ignores_dict_order():
    assert key(source={"a": "1", "b": "2"}) == key(source={"b": "2", "a": "1"})


def run(
    secret: bytes = b"k",
    sender: str = "-",
    team: str = "",
    source: str = "/a",
    event_id: str = "1",
    action: str = "get",
) -> str:
    return keys.run_id(
        secret, sender=sender, team=team, event_source=source, event_id=event_id, action=action
    )


def test_run_id_depends_on_sender_team_event_source_id_action_and_the_key():
    assert run() == run() and len(run()) == 32
    ids = {
        run(),
        run(source="/b"),
        run(event_id="2"),
        run(action="check"),
        run(sender="system:serviceaccount:ci:other"),
        run(team="blue"),
        run(secret=b"another deployment"),
    }
    assert len(ids) == 7


def test_request_digest_depends_on_what_is_asked_and_hides_it():
    data = {"type": "git", "source": {"password": "hunter22"}, "version": {"ref": "1"}}
    digest = keys.request_digest(b"k", action="get", subject=None, data=data)
    assert digest == keys.request_digest(b"k", action="get", subject=None, data=dict(data))
    assert "hunter22" not in digest
    assert digest != keys.request_digest(b"k", action="get", subject="s", data=data)
    other = {**data, "version": {"ref": "2"}}
    assert digest != keys.request_digest(b"k", action="get", subject=None, data=other)


def test_keys_accept_any_string_even_lone_surrogates():
    assert (
        len(keys.cache_key(b"k", image="i", source={"x": "\ud800"}, version=None, params={})) == 64
    )


def test_failure_outcome_quotes_exit_code_and_log_tail():
    outcome = outcome_of_script("get", 3, b"", "line\n" * 1000)
    assert outcome.failure.kind == "resource_failed" and outcome.failure.exit_code == 3
    assert len(outcome.failure.log_tail) <= 2049


def test_invalid_output_outcome_says_why():
    outcome = outcome_of_script("check", 0, b'{"not": "a list"}', "")
    assert outcome.failure.kind == "invalid_output"
    assert "JSON list" in outcome.failure.message


def test_log_tail_keeps_whole_lines():
    tail = log_tail("a" * 3000 + "\nlast line\n", limit=20)
    assert tail.startswith("…") and tail.endswith("last line\n")


def test_invalid_output_never_quotes_stdout(tmp_path):
    from functions.steps.stage_collect import CollectSpec, collect
    from storage import open_store
    from storage.archive import ArchiveOptions

    store = open_store(tmp_path.as_uri())
    outcome = collect(
        store,
        CollectSpec(run_id="r" * 32, action="check", cache_key=None, archive=ArchiveOptions()),
        exit_code=0,
        stdout=f"debug {SECRET} oops".encode(),
        stderr=b"",
        output_dir=None,
        redactor=Redactor(secret_values(source={"password": SECRET}, params={})),
        credentials=Redactor(()),
    )
    assert outcome.failure.kind == "invalid_output"
    assert outcome.failure.message.endswith("at line 1 column 1")
    assert "canary" not in outcome.failure.message
    assert SECRET.encode() not in (tmp_path / "results" / f"{'r' * 32}.json").read_bytes()


def test_stdin_is_utf8_like_go_encoding_json():
    stdin = stdin_payload("check", {"name": "é日本𝄞", "html": "<a&b>", "bad": "x\ud800"}, None, {})
    assert stdin.decode("utf-8") == (
        '{"source":{"name":"é日本𝄞","html":"\\u003ca\\u0026b\\u003e",'
        '"bad":"x\ufffd"},"version":null}'
    )


def test_a_log_tail_keeps_the_last_state_of_each_redrawn_line():
    progress = "".join(f"Receiving objects: {n}% ({n}/100)\r" for n in range(101))
    log = f"Cloning into 'repo'...\n{progress}\nfatal: could not read Username\n"
    tail = log_tail(log * 20, limit=300)
    assert "fatal: could not read Username" in tail
    assert "Receiving objects: 100% (100/100)" in tail
    assert "Receiving objects: 99%" not in tail
    assert "\r" not in tail
