"""One hostile CustomRun fails alone (issue 50, finding 2): nested thousands of levels deep, or
of megabytes, in a field neither the API server nor Tekton's webhook bounds, it made every
LIST of the controller raise (RecursionError) or run out of memory, stopping every team's runs.

The controller now lists a page at a time and decodes each object alone, within bounds
(``functions/kube/objects.py``), in the LIST, the watch and a read alike: a hostile one is
skipped, reported once (a log line, a metric, a Kubernetes Event) and ended ``Undecodable``;
every other CustomRun goes on. The API server's answers are played here as raw bytes over
HTTP (kmock re-encodes what it holds with ``json``, so it cannot hold a deep object); the
cluster tier creates the same objects through the real API server."""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from functions.kube import objects
from functions.kube.objects import Bounds, ListEnd, Undecodable
from functions.kube.tekton_api import TektonApi
from functions.tekton import status as st
from functions.tekton.params import API_VERSION
from testbed.event_sink import EventSink
from tests.fast.test_tekton_controller import Running, customrun
from tests.support.kube_emulator import api_client_for
from tests.support.tekton_pipelines import HOSTILE_PLACES, hostile_custom_run, large_custom_run

LARGE = 1400 * 1024  # the size of the CustomRuns that ran the 256Mi controller out of memory


def with_identity(name: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "resourceVersion": "7"}
    return {"apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun", "metadata": meta, **body}


def page_of(items: list[str], token: str = "", version: str = "42") -> bytes:
    """A LIST answer as the API server writes it (keys sorted: items before metadata)."""
    meta = json.dumps(
        {"continue": token, "resourceVersion": version} if token else {"resourceVersion": version}
    )
    return f'{{"apiVersion":"tekton.dev/v1beta1","items":[{",".join(items)}],"kind":"CustomRunList","metadata":{meta}}}'.encode()


def identified(text: str, name: str) -> str:
    """``text`` (a CustomRun's JSON) with a uid and resourceVersion, as the API server adds."""
    return text.replace(
        '"metadata": {"name": ',
        f'"metadata": {{"uid": "uid-{name}", "resourceVersion": "9", "name": ',
        1,
    )


def hostile_items() -> dict[str, str]:
    """name -> JSON text of each hostile CustomRun: deep at each place, and large."""
    found = {
        f"deep-{n}": identified(hostile_custom_run(f"deep-{n}", "team-b", place), f"deep-{n}")
        for n, place in enumerate(HOSTILE_PLACES)
    }
    for n in range(3):
        name = f"large-{n}"
        found[name] = identified(json.dumps(large_custom_run(name, "team-b", LARGE)), name)
    return found


# --- the decoder ------------------------------------------------------------------------------

# Any integer (the API server writes a float such as 1e20 with all its digits) and finite
# floats: JSON has no other numbers.
json_values = hs.recursive(
    hs.none()
    | hs.booleans()
    | hs.integers()
    | hs.floats(allow_nan=False, allow_infinity=False)
    | hs.text(),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(spec=json_values, managed=json_values)
def test_an_object_within_the_bounds_comes_back_as_json_reads_it_without_managed_fields(
    spec: Any, managed: Any
) -> None:
    obj = with_identity("r", {"spec": spec})
    obj["metadata"]["managedFields"] = [managed]
    expected = json.loads(json.dumps(obj))
    del expected["metadata"]["managedFields"]
    found = list(objects.list_page(page_of([json.dumps(obj)]), Bounds()))
    assert found == [expected, ListEnd("42", "")]


def test_a_page_of_hostile_customruns_yields_every_other_and_names_each_hostile_one() -> None:
    hostile = hostile_items()
    fine = [json.dumps(with_identity(f"fine-{n}", {"spec": {"n": n}})) for n in range(3)]
    page = page_of([fine[0], *hostile.values(), fine[1], fine[2]], token="next")
    with pytest.raises(RecursionError):  # how the controller read it before
        json.loads(page)

    found = list(objects.list_page(page, Bounds(), ("spec.customRef.apiVersion",)))

    decoded = [f for f in found if isinstance(f, dict)]
    assert [d["metadata"]["name"] for d in decoded] == ["fine-0", "fine-1", "fine-2"]
    skipped = {f.name: f for f in found if isinstance(f, Undecodable)}
    assert set(skipped) == set(hostile)
    for name, found_one in skipped.items():
        assert (found_one.namespace, found_one.uid) == ("team-b", f"uid-{name}")
        assert found_one.limit == ("depth" if name.startswith("deep") else "size")
    assert skipped["deep-1"].marks["spec.customRef.apiVersion"] == API_VERSION
    assert found[-1] == ListEnd("42", "next")


def test_an_object_deep_and_wide_past_the_bound_is_read_to_its_end_at_little_cost() -> None:
    """Past the depth bound, what identifies the object is still read, but never by joining
    a path as long as the nesting (a tenant's 10,000 levels with 300,000 strings at the
    bottom took 29 s of CPU that way)."""
    deep = '{"metadata":{"name":"wide","namespace":"team-b"},"spec":'
    deep += "[" * 10000 + ",".join(['""'] * 300000) + "]" * 10000 + "}"
    _, found = objects.watch_event(f'{{"type":"ADDED","object":{deep}}}'.encode(), Bounds())
    assert isinstance(found, Undecodable) and (found.name, found.limit) == ("wide", "depth")


def test_an_object_deep_only_in_its_managed_fields_is_read_without_them() -> None:
    """The API server's managedFields repeat an object's shape; the controller never reads
    them, so their depth counts for nothing."""
    text = json.dumps(with_identity("r", {"spec": {"a": 1}}))
    deep = '{"f:spec":' * 500 + "{}" + "}" * 500
    text = text.replace('"metadata": {', f'"metadata": {{"managedFields": [{deep}], ', 1)
    kind, found = objects.watch_event(f'{{"type":"ADDED","object":{text}}}'.encode(), Bounds())
    assert kind == "ADDED" and isinstance(found, dict) and found["spec"] == {"a": 1}


# --- the API client over HTTP -----------------------------------------------------------------


class Answers(BaseHTTPRequestHandler):
    """The API server's answers, as bytes: ``pages`` by ``continue`` token, and a watch that
    sends ``watch_lines``. Every request's query is kept in ``asked``."""

    pages: ClassVar[dict[str, bytes]] = {}
    watch_lines: ClassVar[list[bytes]] = []
    asked: ClassVar[list[dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        self.asked.append(query)
        if query.get("watch") == ["true"]:
            body = b"".join(line + b"\n" for line in self.watch_lines)
        else:
            body = self.pages[query.get("continue", [""])[0]]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answers() -> Iterator[tuple[type[Answers], TektonApi]]:
    handler = type("Served", (Answers,), {"pages": {}, "watch_lines": [], "asked": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = api_client_for(f"http://127.0.0.1:{server.server_address[1]}")
    yield handler, TektonApi(client, page=2)
    client.close()
    server.shutdown()
    thread.join(5)


def test_the_list_is_read_a_page_at_a_time_and_a_hostile_object_fails_alone(
    answers: tuple[type[Answers], TektonApi],
) -> None:
    served, api = answers
    hostile = hostile_items()
    fine = [json.dumps(customrun(f"fine-{n}")) for n in range(2)]
    served.pages = {
        "": page_of([fine[0], hostile["deep-0"]], token="p2"),
        "p2": page_of([hostile["large-0"], hostile["deep-2"]], token="p3"),
        "p3": page_of([fine[1]], version="77"),
    }

    found = list(api.list_customruns())

    assert [q.get("limit") for q in served.asked] == [["2"]] * 3
    assert [q.get("continue") for q in served.asked] == [None, ["p2"], ["p3"]]
    assert [f["metadata"]["name"] for f in found if isinstance(f, dict)] == ["fine-0", "fine-1"]
    assert [f.name for f in found if isinstance(f, Undecodable)] == [
        "deep-0",
        "large-0",
        "deep-2",
    ]
    assert found[-1] == ListEnd("77", "")


def test_a_list_of_large_customruns_holds_about_one_of_them_in_memory_at_a_time(
    answers: tuple[type[Answers], TektonApi],
) -> None:
    """Eight CustomRuns of 1.4 MB in one page: the client never holds the page, and builds
    no object past its bound (512 KiB)."""
    served, api = answers
    items = [json.dumps(large_custom_run(f"large-{n}", "team-b", LARGE)) for n in range(8)]
    served.pages = {"": page_of(items)}
    tracemalloc.start()
    try:
        found = list(api.list_customruns())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [f.limit for f in found if isinstance(f, Undecodable)] == ["size"] * 8
    page = len(served.pages[""])
    assert peak < page / 2, f"peak {peak} bytes while reading a page of {page}"


def test_a_hostile_object_in_the_watch_fails_alone(
    answers: tuple[type[Answers], TektonApi],
) -> None:
    served, api = answers
    hostile = hostile_items()
    served.watch_lines = [
        f'{{"type":"{kind}","object":{text}}}'.encode()
        for kind, text in [
            ("ADDED", json.dumps(customrun("before"))),
            ("ADDED", hostile["deep-1"]),
            ("MODIFIED", hostile["large-1"]),
            ("ADDED", json.dumps(customrun("after"))),
        ]
    ]
    found = list(api.watch_customruns("42", 5))
    assert [(k, o["metadata"]["name"]) for k, o in found if isinstance(o, dict)] == [
        ("ADDED", "before"),
        ("ADDED", "after"),
    ]
    assert [(k, o.name, o.limit) for k, o in found if isinstance(o, Undecodable)] == [
        ("ADDED", "deep-1", "depth"),
        ("MODIFIED", "large-1", "size"),
    ]


# --- the controller ---------------------------------------------------------------------------


def test_hostile_customruns_are_reported_once_and_ended_while_every_other_team_runs(
    sink: EventSink,
) -> None:
    running = Running(sink, repost_first=60)
    for limit in ("depth", "size"):  # there when the controller lists
        running.api.poison("team-b", f"listed-{limit}", limit)
    running.thread.start()
    try:
        watched = running.api.poison("team-b", "watched", "depth")  # through the watch
        running.ordinary_ones_run("the others Running")
        running.wait("three ended", lambda: len(running.api.status_patches) == 3)
        running.api.changed("MODIFIED", watched)  # the same version again: not reported again
        running.api.poison("team-b", "listed-depth", "depth")  # a new version: reported
        running.wait("the new version ended", lambda: len(running.api.status_patches) == 4)
        assert running.thread.is_alive()
    finally:
        running.controller.stopped.set()
        running.thread.join(10)
    ended = [(name, st.condition_of(status)) for _, name, status in running.api.status_patches]
    assert sorted(name for name, _ in ended) == [
        "listed-depth",
        "listed-depth",
        "listed-size",
        "watched",
    ]
    for _, found in ended:
        assert found is not None
        assert (found["status"], found["reason"]) == ("False", st.UNDECODABLE)
    warnings = [e for e in running.api.events if e[2] == st.UNDECODABLE]
    assert sorted(e[0] for e in warnings) == [name for name, _ in sorted(ended)]
    assert all(e[1] and "cannot read this CustomRun" in e[3] for e in warnings)
    text = running.controller.metrics.exposition().decode()
    assert 'resource_functions_tekton_undecodable_total{limit="depth"} 3.0' in text
    assert 'resource_functions_tekton_undecodable_total{limit="size"} 1.0' in text
    posted = {e.get_attributes().get("subject", "") for e in sink.events}
    assert posted and all(any(s.endswith(f"fine-{n}") for n in range(3)) for s in posted)


def test_a_customrun_of_another_controller_that_cannot_be_decoded_is_left_alone(
    sink: EventSink,
) -> None:
    running = Running(sink)
    found = running.api.poison("team-b", "theirs", "depth")
    found.marks["spec.customRef.apiVersion"] = "example.com/v1"
    running.thread.start()
    try:
        running.api.create(customrun("fine", "team-a"))
        running.wait(
            "the other Running",
            lambda: running.condition("team-a", "fine").get("reason") == st.RUNNING,
        )
    finally:
        running.controller.stopped.set()
        running.thread.join(10)
    assert running.api.status_patches == []
    assert {e[0] for e in running.api.events} == {"fine"}
    text = running.controller.metrics.exposition().decode()
    assert 'resource_functions_tekton_undecodable_total{limit="depth"} 0.0' in text
