"""The short way for repeated gets (``functions.http.repeated_gets``): a repeat of a get already
validated is answered from the cache memory without Flask, and its answer is the full way's.
Each test posts the same requests to the app (short way in front) and to the Flask app alone
(the full way), and compares the answers; the full way's calls are counted, so a test knows
which way answered."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings.http import to_binary_event
from dateutil.parser import isoparse
from werkzeug.test import Client

from functions.bounded_cache import BoundedCache
from functions.http.repeated_gets import MAX_BODY, RepeatedGets
from functions.http.senders import SenderCheck
from functions.service.call import cache_key
from storage import Store
from tests.support.http_helpers import FakeRuntime, cache_entry, event, make_client, post, reply_of

GET = {"type": "mock", "source": {"uri": "x"}, "version": {"ref": "v1"}}
SDK_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Ways:
    """One get service; ``short`` goes through the short way, ``full`` to the Flask app alone."""

    def __init__(self, store: Store, senders: Any = None, **settings: Any) -> None:
        self.runtime = FakeRuntime(store)
        self.short = make_client(store, "get", self.runtime, senders=senders, **settings)
        app = self.short.application
        self.service = app.extensions["service"]
        middleware = app.wsgi_app
        assert isinstance(middleware, RepeatedGets)
        flask_app = middleware.app
        self.full_calls = 0

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            self.full_calls += 1
            return flask_app(environ, start_response)

        middleware.app = counted
        self.full = Client(flask_app)

    def cached(self, store: Store, data: dict[str, Any] = GET) -> None:
        """Run the get once (a miss) and store its artifact: later ones are cache hits."""
        runs = len(self.runtime.ran)
        post(self.short, event("get", data, id=f"run-{runs}"))
        assert len(self.runtime.ran) == runs + 1
        cache_entry(store, self.runtime.ran[-1].cache_key)
        post(self.short, event("get", data, id=f"seen-{runs}"))  # puts it in memory


def headers_of(response: Any) -> dict[str, str]:
    """An answer's headers, less those that differ from one answer to the next anyway."""
    return {k.lower(): v for k, v in response.headers.items() if k.lower() not in ("ce-time",)}


def send(client: Any, request: Any, headers: Any = None) -> Any:
    """Post in binary mode; ``headers`` replace the event's (None: leave that one out)."""
    message = to_binary_event(request)
    merged = {**message.headers, **(headers or {})}
    sent = {name: value for name, value in merged.items() if value is not None}
    return client.post("/", headers=sent, data=message.body)


def same_answer(ways: Ways, request: Any, headers: Any = None) -> Any:
    short = send(ways.short, request, headers)
    full = send(ways.full, request, headers)
    assert (short.status_code, headers_of(short), short.data) == (
        full.status_code,
        headers_of(full),
        full.data,
    )
    if "ce-time" in full.headers:  # made apart: the same form, moments apart
        times = [answer.headers["ce-time"] for answer in (short, full)]
        assert all(SDK_TIME.fullmatch(time) for time in times), times
        assert abs((isoparse(times[0]) - isoparse(times[1])).total_seconds()) < 60
    return short


@pytest.mark.parametrize(
    ("attributes", "headers"),
    [
        ({}, {}),
        ({"traceparent": TRACEPARENT, "tracestate": "vendor=a"}, {}),
        ({"traceparent": "not-a-traceparent"}, {}),
        ({}, {"ce-time": "2026-12-01T05:50:32.123+01:00"}),
        ({}, {"ce-time": None}),  # the SDK sends one; other senders may not
        ({"knativearrivaltime": "2026-12-01T05:50:32.5Z"}, {}),
        ({"subject": "build-7"}, {}),
    ],
    ids=["plain", "trace", "bad-trace", "time-offset", "no-time", "arrival", "subject"],
)
def test_a_repeat_is_answered_by_the_short_way_as_the_full_way_would(
    store: Store, attributes: dict[str, str], headers: dict[str, str | None]
) -> None:
    ways = Ways(store)
    ways.cached(store)
    send(ways.short, event("get", GET, id="sighting", **attributes), headers)
    calls = ways.full_calls
    for n in range(3):
        answer = same_answer(ways, event("get", GET, id=f"repeat-{n}", **attributes), headers)
        assert answer.status_code == 200 and reply_of(answer).get_data()["cached"] is True
        assert answer.headers["ce-requestid"] == f"repeat-{n}"
    assert ways.full_calls == calls  # the short way answered all three
    assert len(ways.runtime.ran) == 1
    if attributes.get("traceparent") == TRACEPARENT:
        assert answer.headers["ce-traceparent"] == TRACEPARENT
        assert answer.headers["ce-tracestate"] == "vendor=a"


def test_one_form_serves_deliveries_with_and_without_a_trace(store: Store) -> None:
    ways = Ways(store)
    ways.cached(store)
    other = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    calls = ways.full_calls
    for n, attributes in enumerate(
        [{"traceparent": TRACEPARENT, "tracestate": "v=1"}, {}, {"traceparent": other}, {}]
    ):
        answer = same_answer(ways, event("get", GET, id=f"d{n}", **attributes))
        assert answer.headers.get("ce-traceparent") == attributes.get("traceparent")
        assert answer.headers.get("ce-tracestate") == attributes.get("tracestate")
    assert ways.full_calls == calls


def test_a_record_kept_anew_is_answered_anew(store: Store) -> None:
    """The cache memory may take a record anew (after a look, or another run once an
    artifact expired): the short way answers from the record the memory holds now."""
    ways = Ways(store)
    ways.cached(store)
    key = ways.runtime.ran[0].cache_key
    before = reply_of(same_answer(ways, event("get", GET, id="before"))).get_data()
    record = {**ways.service.cache_memory.record(key), "metadata": [{"name": "n", "value": "2"}]}
    ways.service.cache_memory.seen(key, record)
    after = reply_of(same_answer(ways, event("get", GET, id="after"))).get_data()
    assert before["metadata"] == [] and after["metadata"] == record["metadata"]


def test_a_varying_attribute_changes_nothing_else(store: Store) -> None:
    """Deliveries that differ in id, time, trace and arrival time share one validation."""
    ways = Ways(store)
    ways.cached(store)
    post(ways.short, event("get", GET, id="a"), headers={"ce-time": "2026-12-01T05:00:00Z"})
    calls = ways.full_calls
    post(ways.short, event("get", GET, id="b"), headers={"ce-time": "2026-12-01T06:00:00Z"})
    post(ways.short, event("get", GET, id="c", traceparent=TRACEPARENT, knativearrivaltime="t"))
    assert ways.full_calls == calls


@pytest.mark.parametrize(
    ("attributes", "headers", "status"),
    [
        ({"id": "x" * 1025}, {}, 400),  # longer than an event attribute may be
        ({}, {"ce-time": "yesterday"}, 400),
        ({}, {"ce-time": "2026-12-01T05:50:32"}, 400),  # no time zone
        ({}, {"ce-id": "%ZZodd"}, 200),  # would be percent-decoded: the full way does it
        ({"id": "per%cent"}, {}, 200),  # sent as per%25cent
        ({}, {"ce-traceparent": TRACEPARENT.replace("-01", "%2D01")}, 200),
        ({}, {"ce-time": "2026-12-01T05%3A50%3A32Z"}, 200),
        ({}, {"ce-id": "with space"}, 200),  # sent back percent-encoded
        ({}, {"ce-id": 'a"quote'}, 200),
        ({"traceparent": TRACEPARENT}, {"ce-tracestate": "a=1, b=2"}, 200),
    ],
    ids=[
        "long-id",
        "bad-time",
        "naive-time",
        "bad-escape",
        "escaped-id",
        "escaped-trace",
        "escaped-time",
        "space-id",
        "quote-id",
        "space-tracestate",
    ],
)
def test_what_the_short_way_cannot_vouch_for_goes_the_full_way(
    store: Store, attributes: dict[str, str], headers: dict[str, str], status: int
) -> None:
    ways = Ways(store)
    ways.cached(store)
    post(ways.short, event("get", GET, id="sighting"))
    calls = ways.full_calls
    answer = same_answer(ways, event("get", GET, **{"id": "evt", **attributes}), headers)
    assert answer.status_code == status
    assert ways.full_calls == calls + 1
    if "id" in attributes and status == 200:
        assert reply_of(answer).get_attributes()["requestid"] == attributes["id"]


def test_a_get_the_memory_cannot_answer_goes_the_full_way(store: Store) -> None:
    ways = Ways(store)
    ways.cached(store)
    calls = ways.full_calls
    other = {**GET, "version": {"ref": "v2"}}
    assert post(ways.short, event("get", other, id="other")).status_code == 200
    assert ways.full_calls == calls + 1 and len(ways.runtime.ran) == 2  # a miss: it ran


def test_a_first_sighting_the_memory_answers_takes_the_short_way(store: Store) -> None:
    ways = Ways(store)
    ways.cached(store)
    calls = ways.full_calls
    answer = same_answer(ways, event("get", GET, id="new", subject="another subject"))
    assert reply_of(answer).get_data()["cached"] is True and ways.full_calls == calls


def test_an_invalid_request_is_refused_by_the_full_way_every_time(store: Store) -> None:
    ways = Ways(store)
    ways.cached(store)
    calls = ways.full_calls
    for n in range(2):
        answer = same_answer(ways, event("get", {**GET, "extra": 1}, id=f"bad-{n}"))
        assert answer.status_code == 400 and "unknown field" in answer.get_data(as_text=True)
    assert ways.full_calls == calls + 2


def test_a_removed_artifact_is_noticed_by_the_look_the_full_way_takes(store: Store) -> None:
    ways = Ways(store, cache_recheck_seconds=0)  # every hit looks in the store
    ways.cached(store)
    calls = ways.full_calls
    assert reply_of(post(ways.short, event("get", GET, id="h"))).get_data()["cached"] is True
    assert ways.full_calls == calls + 1  # the memory never answers: the full way looks
    store.delete(f"artifacts/{ways.runtime.ran[0].cache_key}.tar.zst")
    again = reply_of(post(ways.short, event("get", GET, id="after")))
    assert again.get_data().get("cached") is not True and len(ways.runtime.ran) == 2


def test_gets_with_references_are_resolved_on_every_request(store: Store, tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    (creds / "teams" / "main").mkdir(parents=True)
    (creds / "teams" / "main" / "token").write_text("one\n")
    ways = Ways(store, credentials_provider="dir", credentials_dir=str(creds))
    data = {**GET, "source": {"token": "((token))"}, "build": {"team": "main"}}
    ways.cached(store, data)
    calls = ways.full_calls
    assert reply_of(post(ways.short, event("get", data, id="h"))).get_data()["cached"] is True
    (creds / "teams" / "main" / "token").write_text("two\n")  # rotated: another source, another key
    rotated = reply_of(post(ways.short, event("get", data, id="rotated")))
    assert rotated.get_data().get("cached") is not True and len(ways.runtime.ran) == 2
    assert ways.full_calls == calls + 2


def test_large_bodies_go_the_full_way(store: Store) -> None:
    ways = Ways(store)
    big = {**GET, "params": {"pad": "x" * MAX_BODY}}
    ways.cached(store, big)
    calls = ways.full_calls
    assert reply_of(post(ways.short, event("get", big, id="big"))).get_data()["cached"] is True
    assert ways.full_calls == calls + 1


def test_in_async_mode_a_hit_is_answered_in_the_response_by_both_ways(store: Store) -> None:
    ways = Ways(store, reply_mode="async", sink="http://127.0.0.1:9/")
    key = cache_key(ways.service.config, ways.service.parse(event("get", GET)))
    assert key is not None
    cache_entry(store, key)
    post(ways.short, event("get", GET, id="seen", replymode="sync"))  # puts it in memory
    calls = ways.full_calls
    for attributes in ({}, {"replymode": "async"}):
        answer = same_answer(ways, event("get", GET, id="async-hit", **attributes))
        assert answer.status_code == 200 and reply_of(answer).get_data()["cached"] is True
    assert ways.full_calls == calls and ways.runtime.started == []


def test_a_refused_sender_is_answered_by_the_full_way(store: Store) -> None:
    tokens = {"broker": "system:serviceaccount:ns:broker"}
    senders = SenderCheck(lambda token, _: tokens.get(token), "aud", ("*:broker",))
    ways = Ways(store, senders=senders, sender_audience="aud")
    bearer = {"Authorization": "Bearer broker"}
    post(ways.short, event("get", GET, id="first-run"), headers=bearer)
    cache_entry(store, ways.runtime.ran[-1].cache_key)
    post(ways.short, event("get", GET, id="seen"), headers=bearer)
    calls = ways.full_calls
    assert post(ways.short, event("get", GET, id="ok"), headers=bearer).status_code == 200
    assert ways.full_calls == calls
    assert post(ways.short, event("get", GET, id="none")).status_code == 401
    forged = post(ways.short, event("get", GET, id="x"), headers={"Authorization": "Bearer x"})
    assert forged.status_code == 401 and ways.full_calls == calls + 2


def test_short_answers_are_counted_as_requests_and_cache_hits(store: Store) -> None:
    ways = Ways(store)
    ways.cached(store)
    registry = ways.service.metrics.registry
    hits = ("resource_function_cache_hits_total", {"action": "get"})
    answered = ("resource_function_requests_total", {"action": "get", "status": "200"})
    before = [registry.get_sample_value(*hits), registry.get_sample_value(*answered)]
    calls = ways.full_calls
    for n in range(3):
        post(ways.short, event("get", GET, id=f"n{n}"))
    assert ways.full_calls == calls
    assert registry.get_sample_value(*hits) == before[0] + 3
    assert registry.get_sample_value(*answered) == before[1] + 3


def test_only_the_get_service_has_a_short_way(store: Store) -> None:
    for action in ("check", "put"):
        client = make_client(store, action, FakeRuntime(store))
        assert not isinstance(client.application.wsgi_app, RepeatedGets)


def test_a_fault_in_the_short_way_is_logged_and_the_full_way_answers(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ways = Ways(store)
    ways.cached(store)

    def broken(*_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ways.service, "answer_repeat", broken)
    calls = ways.full_calls
    answer = post(ways.short, event("get", GET, id="after-the-bug"))
    assert answer.status_code == 200 and reply_of(answer).get_data()["cached"] is True
    assert ways.full_calls == calls + 1
    assert "the short way for repeated gets failed" in caplog.text


def test_what_it_remembers_is_bounded_and_a_forgotten_get_is_validated_again(
    store: Store,
) -> None:
    ways = Ways(store)
    middleware = ways.short.application.wsgi_app
    middleware._known = BoundedCache(2)
    ways.cached(store)
    for subject in ("a", "b", "c", "a"):
        answer = same_answer(ways, event("get", GET, id=f"id-{subject}", subject=subject))
        assert reply_of(answer).get_data()["cached"] is True
        forms = [known.form for known in middleware._known.values() if known and known.form]
        assert len(middleware._known) <= 2 and len(forms) <= 2
    assert len(ways.runtime.ran) == 1


def test_the_request_line_says_which_way_answered(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ways = Ways(store)
    ways.cached(store)
    caplog.set_level("INFO", logger="functions")
    post(ways.short, event("get", GET, id="short"))
    post(ways.short, event("get", {**GET, "version": {"ref": "v2"}}, id="full"))
    lines = {
        record.fields["id"]: record.fields
        for record in caplog.records
        if record.getMessage() == "request"
    }
    assert lines["short"]["short_way"] is True and "short_way" not in lines["full"]
    assert lines["short"]["run_id"] and lines["short"]["source"] == "/ci/pipeline"
