"""The settings of the in-pod steps (``stage``, ``collect``), read once from the environment
the task pod gets (see ``functions.steps.pod_contract.STEP_ENV``): the store, the sink and the
archive options; the store's credentials come from the files of its mounted Secret."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from functions.errors import ConfigError
from functions.steps.pod_contract import (
    REPLY_TOKEN_ENV,
    SINK_ENV,
    STORE_CREDENTIALS_ENV,
    STORE_URL_ENV,
)
from storage.archive import ArchiveOptions, Limits
from storage.credentials import read_credentials_dir
from storage.tuning import StoreOptions


@dataclass(frozen=True)
class StepSettings:
    store_url: str
    sink: str = ""  # K_SINK, from the pod spec (collect only): where asynchronous replies go
    archive: ArchiveOptions = field(default_factory=ArchiveOptions)
    limits: Limits = field(default_factory=Limits)
    store_options: StoreOptions = field(default_factory=StoreOptions)
    reply_token: str = field(default="", repr=False)  # for the reply relay (async tasks)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> StepSettings:
        """Raises ``ConfigError`` naming the variable that is missing or malformed, or the
        store's ``StoreUnavailable`` if its credentials directory cannot be read."""
        url = environ.get(STORE_URL_ENV, "")
        if not url:
            raise ConfigError(f"{STORE_URL_ENV} is not set")
        try:
            options = StoreOptions.from_env(environ)
            archive, limits = ArchiveOptions.from_env(environ), Limits.from_env(environ)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if environ.get(STORE_CREDENTIALS_ENV):
            credentials = read_credentials_dir(environ[STORE_CREDENTIALS_ENV])
            options = replace(options, credentials=credentials)
        return cls(
            store_url=url,
            sink=environ.get(SINK_ENV, ""),
            archive=archive,
            limits=limits,
            store_options=options,
            reply_token=_reply_token(environ.get(REPLY_TOKEN_ENV, "")),
        )


def _reply_token(path: str) -> str:
    """The token in the file ``path`` (the run's Secret, mounted); "" without one."""
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise ConfigError(f"{REPLY_TOKEN_ENV}: cannot read {path}: {err.strerror}") from None
