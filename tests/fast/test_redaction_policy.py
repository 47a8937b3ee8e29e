"""Which values are redacted: resolved values, literal values under secret-named keys, URL
userinfo; never a value too short to hide; overlapping secrets leave nothing."""

from __future__ import annotations

import json
import random
import string

import pytest

from functions.protocol import stdin_payload
from functions.redaction import DEFAULT_REDACT_KEYS, REDACTED, Redactor, secret_values
from functions.redaction.forms import forms
from functions.setting_values import redact_keys
from functions.settings import Settings

URL = "https://git.example.com/team/repo.git"
READABLE = {
    "uri": URL,
    "branch": "feature/login-form",
    "message": "the repository is archived",
    "paths": ["src/", "docs/"],
    "depth": 123456,
}
# A value under each default key (examples of the names the globs stand for).
SECRET_KEYS = {
    "password": "hunter2-pw",
    "proxy_password": "proxy-pw-1",
    "db_passwd": "passwd-value",
    "private_key_passphrase": "phrase-value",
    "client_secret": "client-secret-value",
    "secret_access_key": "wJalrXUtnFEMI/K7MDENG",
    "access_token": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "Token": "tok-upper-case",
    "credentials": {"user": "svc-account", "json": '{"type": "service_account"}'},
    "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "json_key": "gcs-json-key-value",
    "key": "the-key-value",
    "apikey": "apikey-value",
    "authorization": "Bearer abc.def.ghi",
    "pin": None,  # not a secret-named key: stays readable
}


def values(source: dict, params: dict | None = None, resolved: tuple[str, ...] = ()) -> set[str]:
    return set(secret_values(source=source, params=params or {}, resolved=resolved))


def test_literal_values_only_under_secret_named_keys() -> None:
    source = {**READABLE, **{k: v for k, v in SECRET_KEYS.items() if v is not None}}
    found = values(source)
    for key, value in SECRET_KEYS.items():
        if isinstance(value, str):
            assert value in found, key
    assert {"svc-account", '{"type": "service_account"}'} <= found  # all below the key
    for value in (URL, "feature/login-form", "the repository is archived", "src/"):
        assert value not in found


def test_logs_keep_a_url_a_branch_and_the_resource_s_own_message_readable() -> None:
    source = {**READABLE, "password": "hunter2-pw", "token": "tok-1234567"}
    log = (
        f"Cloning {URL} (branch feature/login-form) as ci with hunter2-pw\n"
        "error: the repository is archived (depth 123456)\n"
        'payload: {"token":"tok-1234567"}\n'
    )
    shown = Redactor(values(source)).redact_text(log)
    assert shown == (
        f"Cloning {URL} (branch feature/login-form) as ci with {REDACTED}\n"
        "error: the repository is archived (depth 123456)\n"
        f'payload: {{"token":"{REDACTED}"}}\n'
    )


def test_each_secret_named_key_s_value_is_redacted_in_an_echoed_stdin() -> None:
    source = {**READABLE, **{k: v for k, v in SECRET_KEYS.items() if v is not None}}
    params = {"nested": [{"api_token": "nested-token-1"}], "retries": 3, "pin": 123456789}
    stdin = stdin_payload("get", source, {"ref": "v1"}, params).decode()
    redactor = Redactor(values(source, params))
    for shown in (stdin, json.dumps(json.loads(stdin), indent=2)):
        cleaned = redactor.redact_text(shown)
        for value in [*filter(None, SECRET_KEYS.values()), "nested-token-1"]:
            if isinstance(value, str):
                for line in value.splitlines():
                    assert line not in cleaned, value
        assert URL in cleaned and "feature/login-form" in cleaned and "123456789" in cleaned
        assert '"ref":"v1"' in cleaned or '"ref": "v1"' in cleaned


def test_numbers_under_secret_keys_are_secrets_others_not() -> None:
    found = values({"port": 8080, "pin_token": 4821, "secret": 123.5, "on_secret": True})
    assert found == {"4821", "123.5"}


def test_the_userinfo_of_any_url_in_any_string() -> None:
    source = {
        "uri": "https://ci-bot:p%40ss-w0rd@git.example.com/r.git",
        "mirrors": ["see https://x-access-token:ghs_abcdef123456@github.com/o/r please"],
        "plain": "ssh://git.example.com/r.git",
        "token_as_user": "https://ghp_tokenvalue1234@github.com/o/r",
        "odd_scheme": "9git+ssh://deploy:k3y-value@host/r",
    }
    found = values(source)
    assert {"ci-bot:p%40ss-w0rd", "ci-bot:p@ss-w0rd", "p%40ss-w0rd", "p@ss-w0rd"} <= found
    assert {"ghs_abcdef123456", "ghp_tokenvalue1234", "k3y-value"} <= found
    log = "fatal: unable to access 'https://ci-bot:p%40ss-w0rd@git.example.com/r.git/'"
    shown = Redactor(found).redact_text(log)
    assert shown == f"fatal: unable to access 'https://{REDACTED}@git.example.com/r.git/'"
    assert not any("git.example.com" in value for value in found)


def test_resolved_values_whatever_key_they_are_under() -> None:
    assert "resolved-value" in values({"uri": "x"}, resolved=("resolved-value",))


def test_keys_are_globs_matched_case_insensitively_and_configurable() -> None:
    assert values({"Access_Key_ID": "AKIAEXAMPLE1"}) == set()
    found = secret_values(
        source={"Access_Key_ID": "AKIAEXAMPLE1", "password": "pw-value"},
        params={},
        keys=("access_key_id",),
    )
    assert found == ("AKIAEXAMPLE1",)
    assert redact_keys(None) == DEFAULT_REDACT_KEYS
    assert redact_keys("default, access_key_id") == (*DEFAULT_REDACT_KEYS, "access_key_id")
    assert redact_keys("none") == () and redact_keys("") == ()
    env = {"STORE_URL": "file:///tmp/x", "REDACT_KEYS": "*_id,pass*"}
    assert Settings.from_env(env).redact_keys == ("*_id", "pass*")


@pytest.mark.parametrize("short", ["e", "ab", "x y"])
def test_values_under_four_characters_are_never_substituted(short: str) -> None:
    redactor = Redactor([short])
    text = f"Cloning repository {short}-suffix ({short})"
    assert redactor.redact_text(text) == text
    assert not redactor


def test_four_characters_are_enough_for_literal_and_resolved_values_alike() -> None:
    redactor = Redactor(values({"password": "p4s5"}, resolved=("r3s7",)))
    assert redactor.redact_text("p4s5 and r3s7") == f"{REDACTED} and {REDACTED}"


def test_a_multi_line_value_whole_and_by_lines_but_not_lines_too_short_or_punctuation() -> None:
    value = '{\n  "type": "service_account",\n  "n": 1,\n  "ab": 2\n}\n---\n'
    redactor = Redactor([value])
    # the line breaks at either end of a match are not part of it
    assert redactor.redact_text(f"creds: {value}") == f"creds: {REDACTED}\n"
    shown = redactor.redact_text('{\n  "type": "service_account",\n}\n---\n "n": 1, \n')
    assert shown == f"{{\n{REDACTED}\n}}\n---\n {REDACTED} \n"
    # a line without its indent
    assert redactor.redact_text('x\n"type": "service_account",') == f"x\n{REDACTED}"


def test_overlapping_secrets_leave_nothing_of_either() -> None:
    first, second = "abcd-secret-1234", "1234-other-5678"
    redactor = Redactor([first, second])
    assert redactor.redact_text(f"<{first}-other-5678>") == f"<{REDACTED}>"
    assert redactor.redact_text(f"<abcd-secret-{second}>") == f"<{REDACTED}>"
    inner = Redactor(["long-outer-secret-value", "outer-secret"])
    assert inner.redact_text("x long-outer-secret-value y") == f"x {REDACTED} y"
    assert inner.redact_text("x outer-secret y") == f"x {REDACTED} y"


def test_secrets_next_to_each_other_are_one_redaction_apart_ones_two() -> None:
    redactor = Redactor(["first-secret", "second-secret"])
    assert redactor.redact_text("first-secretsecond-secret") == REDACTED
    assert redactor.redact_text("first-secret second-secret") == f"{REDACTED} {REDACTED}"


def test_a_long_log_of_many_lines_keeps_every_line_and_loses_every_occurrence() -> None:
    """Matches are mapped back through line breaks block by block (16 KiB): occurrences in
    many blocks, across a block's edge, folded across it, and after a block of breaks only."""
    secret = "s3cret-value-42"
    parts, expected = [], []
    for n in range(5000):
        line = f"line {n}: fetching layer {n * 7919 % 10007}\n"
        parts.append(line)
        expected.append(line)
        if n % 97 == 0:
            shown = secret if n % 2 else secret[:6] + "\r\n" + secret[6:]
            parts.append(f"token={shown}\n{secret}\n")  # also right after a line break
            expected.append(f"token={REDACTED}\n{REDACTED}\n")
        if n == 2500:
            parts.append("\n" * 20000)  # more than a block of nothing but line breaks
            expected.append("\n" * 20000)
    text, want = "".join(parts), "".join(expected)
    assert len(text) > 10 * 16384
    assert Redactor([secret]).redact_text(text) == want
    for edge in (16384, 5 * 16384, 9 * 16384):  # an occurrence across a block's edge
        for at in range(edge - len(secret) - 2, edge + 2):
            shown = "x" * at + secret + "\n" + "y" * 10
            assert Redactor([secret]).redact_text(shown) == "x" * at + REDACTED + "\n" + "y" * 10


def test_a_form_is_found_from_its_rarest_bytes_at_either_end_and_across_a_search_block() -> None:
    """A form's anchor starts at its rarest byte (here the `Z`, 11 bytes in), so the form
    begins before the anchor: found at the text's first byte, at its last, and at every
    position across the edge of a 256 KiB search block, where the anchor is in one block
    and the form's start in the one before."""
    secret = "lowercase-Zone-of-text"
    redactor = Redactor([secret])
    assert redactor.redact_text(secret + " tail") == f"{REDACTED} tail"
    assert redactor.redact_text("head " + secret) == f"head {REDACTED}"
    edge = 1 << 18
    for at in range(edge - len(secret) - 2, edge + 2):
        shown = "x" * at + secret + "y" * 10
        assert redactor.redact_text(shown) == "x" * at + REDACTED + "y" * 10, at


def test_forms_of_different_secrets_do_not_share_an_anchor_an_encoder_wrote() -> None:
    """Each match of an anchor is compared with each form it stands for. Go's JSON writes
    `&` as `\\u0026` in every secret that holds one: anchored there, 200 secrets' forms would
    be compared at every `\\u0026` of a log. An anchor stands for one secret's forms, and no
    anchor is a run of one byte (a form of backslashes escaped thrice has other windows),
    and every secret is still redacted in each of those forms."""
    rng = random.Random(24)
    letters = string.ascii_lowercase
    values = [
        "".join(rng.choices(letters, k=5)) + "&" + "".join(rng.choices(letters, k=5))
        for _ in range(200)
    ] + ['"C:\\Users"' + "".join(rng.choices(letters, k=4))]
    redactor = Redactor(values)
    owners: dict[bytes, str] = {}  # a form's secret is the first that has it, as the redactor's
    for value in values:
        for form in forms(value):
            owners.setdefault(form, value)
    for anchored in redactor._anchored:
        assert len({owners[redactor._patterns[index]] for index, _ in anchored}) == 1
    assert not [a for a in redactor._anchors if len(a) > 1 and a.count(a[:1]) == len(a)]
    for value in values:
        shown = json.dumps({"v": value}).replace("&", "\\u0026")
        redacted = redactor.redact_text(f"log {shown} end")
        assert (
            value not in redacted and redacted.startswith("log ") and redacted.endswith(" end")
        ), value
        assert REDACTED in redacted


def test_one_secret_is_not_anchored_at_an_escape_or_at_bytes_of_another_language() -> None:
    """`\\` starts the escapes of every log that escapes (.NET writes `+` as `\\u002B`), and
    bytes past ASCII are all of a log in another language: neither is where an anchor starts
    while a form has rarer ASCII (here its upper case)."""
    key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    redactor = Redactor([key, "пароль-Xyz-секрет"])
    assert not [a for a in redactor._anchors if a[:1] == b"\\" or a[0] >= 0x80]
    shown = json.dumps({"key": key}).replace("+", "\\u002B")
    assert redactor.redact_text(f"got {shown}") == f'got {{"key": "{REDACTED}"}}'
