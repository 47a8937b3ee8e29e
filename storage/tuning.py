"""Tuning knobs shared by the object-store backends, read once from the environment."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from storage.credentials import StoreCredentials

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
S3_MIN_PART_SIZE = 5 * MiB  # S3 refuses smaller parts (except the last) with EntityTooSmall
S3_MAX_PART_SIZE = 5 * GiB
MAX_CONCURRENCY = 64
ADDRESSING_STYLES = ("auto", "path", "virtual")

_SIZE = re.compile(r"(\d+)\s*(B|KiB|Ki|MiB|Mi|GiB|Gi)?")
_T = TypeVar("_T")


@dataclass(frozen=True)
class StoreOptions:
    """How backends move data.

    ``part_size``: bytes per multipart part (S3) or resumable chunk (GCS, rounded up to a
    multiple of 256 KiB); a stream shorter than one part goes up in a single request.
    ``concurrency``: S3 parts in flight at once. An S3 upload buffers at most about
    ``(concurrency + 1) * part_size`` bytes; GCS resumable uploads are sequential and buffer
    about two chunks. ``threads``: how many threads use the store at once (a service's
    request threads), each with up to ``concurrency`` parts in flight: the S3 client keeps
    that many connections. ``s3_addressing_style``: ``path``, ``virtual`` or ``auto``; ``None``
    means ``path`` when an S3 endpoint URL is configured (MinIO, moto) and ``auto`` otherwise.
    Invalid values raise ``ValueError``.

    The rest is what the client libraries' own variables say, read here once so that no
    other module looks at the environment: the S3 endpoint the user configured for boto3
    (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``), whether the user chose a retry mode or a
    checksum policy (then botocore's reading of it stands), the GCS project and whether
    ``STORAGE_EMULATOR_HOST`` points at an emulator. ``credentials``: given explicitly (the
    task pod's mounted Secret files), else the libraries find their own.
    """

    # 8 MiB: as fast as 16 MiB against S3 here, with ~50 MiB less peak memory per upload;
    # S3's 10,000-part limit then caps one artifact at 78 GiB (raise it for bigger ones).
    part_size: int = 8 * MiB
    concurrency: int = 4
    s3_addressing_style: str | None = None
    threads: int = 1
    s3_endpoint: str = ""
    s3_retry_mode_chosen: bool = False  # AWS_RETRY_MODE is set
    s3_checksums_chosen: bool = False  # AWS_REQUEST_CHECKSUM_CALCULATION is set
    gcs_project: str = ""
    gcs_emulator: bool = False  # STORAGE_EMULATOR_HOST is set
    credentials: StoreCredentials | None = field(default=None, repr=False)

    @property
    def s3_endpoint_url(self) -> str:
        """The S3 endpoint in use: the explicit credentials' own, else the configured one."""
        return (self.credentials and self.credentials.s3_endpoint) or self.s3_endpoint

    def __post_init__(self) -> None:
        for name, problem in (
            ("part_size", _part_size_problem(self.part_size)),
            ("concurrency", _concurrency_problem(self.concurrency)),
            ("s3_addressing_style", _style_problem(self.s3_addressing_style)),
            ("threads", None if self.threads >= 1 else "must be at least 1"),
        ):
            if problem:
                raise ValueError(f"{name}: {problem}")

    @classmethod
    def from_process_env(cls) -> StoreOptions:
        """``from_env`` of this process's environment: the default of ``open_store``."""
        return cls.from_env(os.environ)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StoreOptions:
        """Options from ``STORE_PART_SIZE`` (bytes, or e.g. ``64MiB``), ``STORE_CONCURRENCY``
        and ``S3_ADDRESSING_STYLE``; unset or empty means the default. A bad value raises
        ``ValueError`` naming the variable and what is accepted."""
        defaults = cls()
        part_size = _from_env(environ, "STORE_PART_SIZE", _parse_size, _part_size_problem)
        concurrency = _from_env(environ, "STORE_CONCURRENCY", parse_int, _concurrency_problem)
        style = _from_env(environ, "S3_ADDRESSING_STYLE", str, _style_problem)
        return cls(
            part_size=defaults.part_size if part_size is None else part_size,
            concurrency=defaults.concurrency if concurrency is None else concurrency,
            s3_addressing_style=style,
            s3_endpoint=environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or "",
            s3_retry_mode_chosen=bool(environ.get("AWS_RETRY_MODE")),
            s3_checksums_chosen=bool(environ.get("AWS_REQUEST_CHECKSUM_CALCULATION")),
            gcs_project=environ.get("GOOGLE_CLOUD_PROJECT", ""),
            gcs_emulator=bool(environ.get("STORAGE_EMULATOR_HOST")),
        )


def _from_env(
    environ: Mapping[str, str],
    name: str,
    parse: Callable[[str], _T],
    problem_of: Callable[[_T], str | None],
) -> _T | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = parse(raw)
    except ValueError as err:
        raise ValueError(f"{name}={raw!r}: {err}") from None
    problem = problem_of(value)
    if problem:
        raise ValueError(f"{name}={raw!r}: {problem}")
    return value


def _parse_size(raw: str) -> int:
    match = _SIZE.fullmatch(raw)
    if not match:
        raise ValueError("not a size; use bytes or a binary unit, e.g. 16MiB or 1GiB")
    unit = (match.group(2) or "B")[:2]
    return int(match.group(1)) * {"B": 1, "Ki": KiB, "Mi": MiB, "Gi": GiB}[unit]


def env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """The integer setting ``name`` (unset or blank: ``default``): the one parser of integer
    settings, here at the bottom so every layer can use it. ``ValueError`` naming the
    variable; the caller checks the range."""
    value = _from_env(environ, name, parse_int, lambda _: None)
    return default if value is None else value


def parse_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("not an integer") from None


def _part_size_problem(size: int) -> str | None:
    if S3_MIN_PART_SIZE <= size <= S3_MAX_PART_SIZE:
        return None
    return f"must be between 5 MiB (the S3 minimum part size) and 5 GiB, got {size} bytes"


def _concurrency_problem(count: int) -> str | None:
    return None if 1 <= count <= MAX_CONCURRENCY else f"must be between 1 and {MAX_CONCURRENCY}"


def _style_problem(style: str | None) -> str | None:
    if style is None or style in ADDRESSING_STYLES:
        return None
    return f"must be one of {', '.join(ADDRESSING_STYLES)}"
