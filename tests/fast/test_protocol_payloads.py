"""The resource protocol's inputs and outputs, exactly as Concourse defines them."""

import json
import re

import pytest

from functions.model import Build
from functions.protocol import (
    InvalidOutput,
    build_env,
    parse_check_output,
    parse_version_output,
    stdin_payload,
)


@pytest.mark.parametrize(
    "action, version, params, expected",
    [
        pytest.param("check", None, {}, {"source": {"u": "x"}, "version": None}, id="first-check"),
        pytest.param(
            "check",
            {"ref": "a"},
            {},
            {"source": {"u": "x"}, "version": {"ref": "a"}},
            id="check-from-version",
        ),
        pytest.param(
            "get",
            {"ref": "a"},
            {},
            {"source": {"u": "x"}, "version": {"ref": "a"}},
            id="get-params-omitted-when-empty",
        ),
        pytest.param(
            "get",
            {"ref": "a"},
            {"depth": 1},
            {"source": {"u": "x"}, "version": {"ref": "a"}, "params": {"depth": 1}},
            id="get-with-params",
        ),
        pytest.param(
            "put",
            None,
            {"file": "x"},
            {"source": {"u": "x"}, "params": {"file": "x"}},
            id="put-no-version-key",
        ),
        pytest.param("put", None, {}, {"source": {"u": "x"}}, id="put-without-params"),
    ],
)
def test_stdin_has_exactly_concourse_keys(action, version, params, expected):
    assert json.loads(stdin_payload(action, {"u": "x"}, version, params)) == expected


def test_check_gets_no_build_env():
    assert build_env("check", Build(id="1")) == {}


def test_in_and_out_get_every_build_variable():
    build = Build(
        id="7",
        name="42",
        job="unit",
        pipeline="main",
        team="t",
        url="https://ci/b/7",
        external_url="https://ci",
        instance_vars='{"a":1}',
    )
    env = build_env("get", build)
    assert env == {
        "BUILD_ID": "7",
        "BUILD_NAME": "42",
        "BUILD_JOB_NAME": "unit",
        "BUILD_PIPELINE_NAME": "main",
        "BUILD_TEAM_NAME": "t",
        "BUILD_PIPELINE_INSTANCE_VARS": '{"a":1}',
        "ATC_EXTERNAL_URL": "https://ci",
        "BUILD_URL": "https://ci/b/7",
    }
    assert build_env("put", build) == env


@pytest.mark.parametrize(
    "stdout, versions",
    [
        pytest.param(b'[{"ref":"a"},{"ref":"b"}]', [{"ref": "a"}, {"ref": "b"}], id="list"),
        pytest.param(b"null", [], id="null-is-empty"),
        pytest.param(b"[]", [], id="empty"),
        pytest.param(
            b'  \n[{"n":"1"}] trailing noise {"x":1}', [{"n": "1"}], id="first-value-only"
        ),
    ],
)
def test_check_output_is_parsed(stdout, versions):
    assert parse_check_output(stdout) == versions


@pytest.mark.parametrize(
    "stdout, message",
    [
        pytest.param(b"", "empty", id="empty"),
        pytest.param(b"not json", "not JSON", id="garbage"),
        pytest.param(b'{"ref":"a"}', "JSON list", id="object-not-list"),
        pytest.param(b'[{"ref":1}]', "versions[0].ref must be a string", id="number-value"),
        pytest.param(b'[{"ref":{"x":"y"}}]', "versions[0].ref must be a string", id="nested"),
        pytest.param(b'["a"]', "versions[0] must be an object", id="string-version"),
        pytest.param(b"\xff\xfe", "not UTF-8", id="binary"),
    ],
)
def test_malformed_check_output_is_rejected_with_reason(stdout, message):
    with pytest.raises(InvalidOutput, match=re.escape(message)):
        parse_check_output(stdout)


def test_version_output_with_metadata():
    out = b'{"version":{"ref":"a"},"metadata":[{"name":"author","value":"me"}]}\nlog line'
    assert parse_version_output(out) == ({"ref": "a"}, [{"name": "author", "value": "me"}])


def test_a_metadata_field_keeps_its_other_string_members_and_drops_the_rest():
    # git-resource gives dates and messages a "type" (what a UI renders them by).
    out = json.dumps(
        {
            "version": {"ref": "a"},
            "metadata": [
                {"name": "author_date", "value": "2026-12-02 02:09:15 +0000", "type": "time"},
                {"name": "n", "value": "1", "count": 1, "tags": ["x"], "note": None},
            ],
        }
    ).encode()
    assert parse_version_output(out)[1] == [
        {"name": "author_date", "value": "2026-12-02 02:09:15 +0000", "type": "time"},
        {"name": "n", "value": "1"},
    ]


def test_version_output_without_metadata():
    assert parse_version_output(b'{"version":{"ref":"a"}}') == ({"ref": "a"}, [])


@pytest.mark.parametrize(
    "stdout, message",
    [
        pytest.param(b"[]", "JSON object", id="list"),
        pytest.param(b'{"metadata":[]}', "no 'version'", id="no-version"),
        pytest.param(b'{"version":{"a":true}}', "version.a must be a string", id="bool"),
        pytest.param(b'{"version":{},"metadata":{}}', "metadata must be a list", id="meta-obj"),
        pytest.param(
            b'{"version":{},"metadata":[{"value":"x"}]}', "metadata[0]", id="meta-no-name"
        ),
        pytest.param(
            json.dumps(
                {"version": {}, "metadata": [{"name": "n", "value": "", "big": "x" * (1 << 20)}]}
            ).encode(),
            f"bytes of JSON, over {1 << 20}",
            id="meta-too-large",
        ),
    ],
)
def test_malformed_version_output_is_rejected_with_reason(stdout, message):
    with pytest.raises(InvalidOutput, match=re.escape(message)):
        parse_version_output(stdout)
