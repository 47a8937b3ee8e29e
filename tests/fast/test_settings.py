"""Settings come from the environment once; each bad value is refused naming its variable."""

import json

import pytest

from functions.errors import ConfigError
from functions.resource_types import DEFAULT_RESOURCE_TYPES
from functions.settings import Settings


def test_defaults_are_local_and_safe():
    settings = Settings.from_env({"HOME": "/home/u"})
    assert settings.store_url == "file:///home/u/.local/share/resource-functions/store"
    assert settings.runtime == "container" and settings.reply_mode == "sync"
    assert set(settings.resource_types) == set(DEFAULT_RESOURCE_TYPES)
    assert settings.cache_secret_generated and len(settings.cache_secret) == 32
    assert settings.archive.format == "zstd" and settings.task_timeout_seconds == 3600
    assert settings.history_limit == 1000
    assert settings.task_name_files == "auto"
    assert Settings.from_env({"TASK_NAME_FILES": "off"}).task_name_files == "off"


def test_history_limit_and_a_type_check_interval_are_read():
    types = json.dumps({"git": {"image": "img/git:1", "check_every": 60}})
    settings = Settings.from_env({"HISTORY_LIMIT": "50", "RESOURCE_TYPES": types})
    assert settings.history_limit == 50
    assert settings.resource_types["git"].check_every == 60


def test_the_check_lease_lasts_30_seconds_and_zero_turns_it_off():
    assert Settings.from_env({}).check_lease_seconds == 30
    assert Settings.from_env({"CHECK_LEASE_SECONDS": "0"}).check_lease_seconds == 0
    assert Settings.from_env({"CHECK_LEASE_SECONDS": "7.5"}).check_lease_seconds == 7.5


def test_resource_types_from_json_with_per_type_settings(tmp_path):
    spec = {
        "git": "img/git:1",
        "slow": {"image": "img/slow:1", "timeout_seconds": 5, "privileged": True},
    }
    path = tmp_path / "types.json"
    path.write_text(json.dumps(spec))
    for value in (json.dumps(spec), str(path)):
        types = Settings.from_env({"RESOURCE_TYPES": value}).resource_types
        assert types["git"].image == "img/git:1"
        assert types["slow"].timeout_seconds == 5 and types["slow"].privileged


@pytest.mark.parametrize(
    "env, variable",
    [
        pytest.param({"RUNTIME": "lambda"}, "RUNTIME", id="runtime"),
        pytest.param({"REPLY_MODE": "later"}, "REPLY_MODE", id="reply-mode"),
        pytest.param({"TASK_NAME_FILES": "on"}, "TASK_NAME_FILES", id="name-files"),
        pytest.param({"TASK_TIMEOUT_SECONDS": "soon"}, "TASK_TIMEOUT_SECONDS", id="timeout-text"),
        pytest.param({"TASK_TIMEOUT_SECONDS": "-1"}, "TASK_TIMEOUT_SECONDS", id="timeout-negative"),
        pytest.param({"RESOURCE_TYPES": "{nope"}, "RESOURCE_TYPES", id="types-json"),
        pytest.param({"HISTORY_LIMIT": "0"}, "HISTORY_LIMIT", id="history-limit-zero"),
        pytest.param({"HISTORY_LIMIT": "many"}, "HISTORY_LIMIT", id="history-limit-text"),
        pytest.param({"CHECK_LEASE_SECONDS": "-1"}, "CHECK_LEASE_SECONDS", id="lease-negative"),
        pytest.param({"CHECK_LEASE_SECONDS": "nan"}, "CHECK_LEASE_SECONDS", id="lease-nan"),
        pytest.param(
            {"RESOURCE_TYPES": '{"git": {"image": "i", "check_every": "1m"}}'},
            "check_every",
            id="type-interval-text",
        ),
        pytest.param({"RESOURCE_TYPES": "/no/such/file"}, "RESOURCE_TYPES", id="types-file"),
        pytest.param(
            {"RESOURCE_TYPES": '{"git": {"image": "x", "colour": 1}}'},
            "colour",
            id="types-unknown-key",
        ),
        pytest.param({"RESOURCE_TYPES": '{"git": 3}'}, "RESOURCE_TYPES['git']", id="types-number"),
        pytest.param(
            {"RESOURCE_TYPES": '{"git": {"image": "x", "timeout_seconds": "abc"}}'},
            "timeout_seconds",
            id="types-timeout-text",
        ),
        pytest.param(
            {"RESOURCE_TYPES": '{"git": {"image": "x", "timeout_seconds": 0}}'},
            "timeout_seconds",
            id="types-timeout-zero",
        ),
        pytest.param({"ARCHIVE_LEVEL": "99"}, "level", id="archive-level"),
        pytest.param({"ARCHIVE_FORMAT": "rar"}, "rar", id="archive-format"),
        pytest.param({"STORE_PART_SIZE": "1KiB"}, "STORE_PART_SIZE", id="part-size"),
        pytest.param({"LOG_LEVEL": "loud"}, "LOG_LEVEL", id="log-level"),
        pytest.param({"PORT": "http"}, "PORT='http': not an integer", id="port-word"),
        pytest.param({"THREADS": "0"}, "THREADS=0: expected a positive", id="threads-zero"),
        pytest.param(
            {"MAX_RUNS_PER_TEAM": "0"}, "MAX_RUNS_PER_TEAM=0: expected a positive", id="runs-zero"
        ),
        pytest.param({"MAX_RUNS_PER_TEAM": "many"}, "MAX_RUNS_PER_TEAM='many'", id="runs-word"),
        pytest.param(
            {"ARCHIVE_THREADS": "two"},
            "ARCHIVE_THREADS='two': not an integer",
            id="archive-threads-word",
        ),
        pytest.param(
            {"STORE_CONCURRENCY": "2.5"},
            "STORE_CONCURRENCY='2.5': not an integer",
            id="concurrency-fraction",
        ),
    ],
)
def test_bad_values_name_the_variable(env, variable):
    with pytest.raises(ConfigError, match=variable.replace("[", r"\[").replace("]", r"\]")):
        Settings.from_env(env)


def test_whole_numbers_from_the_environment():
    settings = Settings.from_env(
        {"PORT": " 9090 ", "THREADS": "4", "ARCHIVE_THREADS": "2", "STORE_CONCURRENCY": "8"}
    )
    assert (settings.port, settings.threads) == (9090, 4)
    assert settings.archive.threads == 2 and settings.store_options.concurrency == 8


def test_serve_binds_loopback_unless_told() -> None:
    assert Settings.from_env({}).host == "127.0.0.1"
    assert Settings.from_env({"HOST": "0.0.0.0"}).host == "0.0.0.0"


@pytest.mark.parametrize(
    ("env", "host", "open_"),
    [
        ({}, "127.0.0.1", False),
        ({}, "0.0.0.0", True),
        ({"SENDER_AUDIENCE": "rf"}, "0.0.0.0", False),
        ({"ALLOWED_IMAGES": ""}, "0.0.0.0", False),
        ({"ALLOWED_IMAGES": "docker.io/concourse/*"}, "10.0.0.5", False),
    ],
    ids=["loopback", "open", "senders-checked", "catalogue-only", "images-restricted"],
)
def test_a_service_reachable_by_others_says_what_is_open(
    env: dict[str, str], host: str, open_: bool
) -> None:
    from functions.settings import open_to_the_network

    warning = open_to_the_network(Settings.from_env(env), host)
    assert (warning is not None) == open_
    if warning:
        assert host in warning and "SENDER_AUDIENCE" in warning and "ALLOWED_IMAGES" in warning
