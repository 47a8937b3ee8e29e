"""Request data is validated completely; every rejection says what was wrong."""

import pytest

from functions.errors import InvalidRequest
from functions.model import ArtifactRef, ResourceType
from functions.request_data import parse_request_data

CATALOGUE = {"git": ResourceType(image="docker.io/concourse/git-resource:1.17")}
PREFIX = "s3://bucket/ci/artifacts/"
EVENT = {"id": "e1", "source": "/test", "subject": "pipeline/main"}


def parse(action, data):
    return parse_request_data(
        data,
        action=action,
        event=EVENT,
        resource_types=CATALOGUE,
        artifact_url_prefix=PREFIX,
        reply_async=False,
    )


def test_catalogue_type_resolves_to_its_image():
    request = parse("check", {"type": "git", "source": {"uri": "x"}})
    assert request.resource_type.image == "docker.io/concourse/git-resource:1.17"
    assert request.type_name == "git" and request.version is None
    assert request.subject == "pipeline/main"


def test_explicit_image_is_accepted():
    image = "registry.example.com/team/res@sha256:" + "a" * 64
    request = parse("get", {"image": image, "source": {}, "version": {"v": "1"}})
    assert request.resource_type.image == image


def test_put_inputs_become_store_keys_with_optional_digest():
    digest = "sha256:" + "b" * 64
    request = parse(
        "put",
        {
            "type": "git",
            "source": {},
            "inputs": {
                "repo": PREFIX + "x.tar.zst",
                "other": {"url": PREFIX + "y.tar", "digest": digest},
            },
        },
    )
    assert request.inputs == {
        "repo": ArtifactRef("artifacts/x.tar.zst"),
        "other": ArtifactRef("artifacts/y.tar", digest),
    }


def test_build_numbers_and_instance_vars_become_strings():
    request = parse(
        "get",
        {
            "type": "git",
            "source": {},
            "version": {"v": "1"},
            "build": {"id": 12, "instance_vars": {"b": 2, "a": 1}},
        },
    )
    assert request.build.id == "12" and request.build.instance_vars == '{"a":1,"b":2}'


@pytest.mark.parametrize(
    "action, data, problem",
    [
        pytest.param("check", [], "data must be a JSON object", id="not-object"),
        pytest.param("check", {"source": {}}, "exactly one of 'type'", id="no-type"),
        pytest.param(
            "check",
            {"type": "git", "image": "a/b", "source": {}},
            "exactly one",
            id="type-and-image",
        ),
        pytest.param(
            "check",
            {"type": "svn", "source": {}},
            "'svn' is not in the catalogue",
            id="unknown-type",
        ),
        pytest.param(
            "check", {"image": "a b; rm -rf /", "source": {}}, "not a valid image", id="bad-image"
        ),
        pytest.param("check", {"type": "git"}, "'source' is required", id="no-source"),
        pytest.param(
            "check",
            {"type": "git", "source": []},
            "'source' must be a JSON object",
            id="source-list",
        ),
        pytest.param(
            "check",
            {"type": "git", "source": {}, "params": {}},
            "unknown field(s) for check: params",
            id="check-params",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}},
            "'version' is required for get",
            id="get-no-version",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": {"a": 1}},
            "mapping strings to strings",
            id="version-number",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "version": {}},
            "unknown field(s) for put: version",
            id="put-version",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "inputs": {"../x": PREFIX + "a"}},
            "input name '../x'",
            id="input-name-traversal",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "inputs": {"a": "s3://other/a"}},
            "must be an artifact in this store",
            id="input-foreign-bucket",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "inputs": {"a": PREFIX + "../x"}},
            "must be an artifact in this store",
            id="input-url-traversal",
        ),
        pytest.param(
            "put",
            {
                "type": "git",
                "source": {},
                "inputs": {"a": {"url": PREFIX + "a.tar", "digest": "md5:x"}},
            },
            "digest must be",
            id="bad-digest",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "inputs": {"a": PREFIX + "k.json"}},
            "must be an artifact in this store",
            id="input-cache-record-not-artifact",
        ),
        pytest.param(
            "put",
            {"type": "git", "source": {}, "inputs": {"a": PREFIX}},
            "must be an artifact in this store",
            id="input-prefix-only",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": {}, "build": {"url": "x" * 5000}},
            "build.url is longer than",
            id="build-field-too-long",
        ),
        pytest.param(
            "check",
            {"type": "t" * 10_000, "source": {}},
            "... is not in the catalogue",
            id="long-value-clipped-in-message",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": {}, "build": {"x": "1"}},
            "unknown build field(s): x",
            id="build-unknown",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": {}, "build": {"id": []}},
            "build.id must be a string",
            id="build-list",
        ),
    ],
)
def test_invalid_request_names_the_problem(action, data, problem):
    with pytest.raises(InvalidRequest) as caught:
        parse(action, data)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_all_problems_reported_at_once():
    with pytest.raises(InvalidRequest) as caught:
        parse("get", {"source": [], "bogus": 1})
    assert len(caught.value.problems) == 4


def test_oversized_event_attributes_are_rejected():
    with pytest.raises(InvalidRequest, match="event attribute 'subject' is longer"):
        parse_request_data(
            {"type": "git", "source": {}},
            action="check",
            event={**EVENT, "subject": "s" * 2000},
            resource_types=CATALOGUE,
            artifact_url_prefix=PREFIX,
            reply_async=False,
        )


def test_a_check_may_continue_from_the_history():
    request = parse("check", {"type": "git", "source": {}, "version": "latest-known"})
    assert request.latest_known and request.version is None


def test_a_check_may_set_its_interval():
    request = parse("check", {"type": "git", "source": {}, "check_every": 60})
    assert request.check_every == 60.0 and not request.latest_known


@pytest.mark.parametrize(
    "action, data, problem",
    [
        pytest.param(
            "check",
            {"type": "git", "source": {}, "version": "latest"},
            "or 'latest-known' (continue from the history)",
            id="check-other-string",
        ),
        pytest.param(
            "check",
            {"type": "git", "source": {}, "version": ["a"]},
            "'version' must be an object mapping strings to strings or 'latest-known'",
            id="check-list",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": "latest-known"},
            "'version' must be an object mapping strings to strings",
            id="get-latest-known",
        ),
        pytest.param(
            "check",
            {"type": "git", "source": {}, "check_every": "1m"},
            "'check_every' must be a number of seconds",
            id="interval-text",
        ),
        pytest.param(
            "check",
            {"type": "git", "source": {}, "check_every": -1},
            "'check_every' must be a number of seconds",
            id="interval-negative",
        ),
        pytest.param(
            "get",
            {"type": "git", "source": {}, "version": {}, "check_every": 5},
            "unknown field(s) for get: check_every",
            id="interval-on-get",
        ),
    ],
)
def test_history_fields_are_validated(action, data, problem):
    with pytest.raises(InvalidRequest) as raised:
        parse(action, data)
    assert any(problem in p for p in raised.value.problems), raised.value.problems
