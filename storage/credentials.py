"""Store credentials given as files: a mounted Secret, one file per key, as Kubernetes mounts
one. The task pod's ``stage`` and ``collect`` steps reach the store this way, never through
environment variables, so not even a readable ``/proc/<pid>/environ`` holds a credential.

    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN   S3 / MinIO keys
    AWS_REGION (or AWS_DEFAULT_REGION), AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)
    service-account.json                                          a GCS service-account key

The key names are those of the Secret that the functions take with ``envFrom``, so one
Secret serves both. Files are read once; a trailing newline is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.store_errors import StoreUnavailable

GCS_KEY_FILE = "service-account.json"
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class StoreCredentials:
    """Credentials and endpoint settings handed to the client libraries explicitly."""

    aws_access_key_id: str = field(default="", repr=False)
    aws_secret_access_key: str = field(default="", repr=False)
    aws_session_token: str = field(default="", repr=False)
    aws_region: str = ""
    s3_endpoint: str = ""
    gcs_key_file: str = ""  # a path: the key stays in its file


def read_credentials_dir(path: str) -> StoreCredentials:
    """The credentials in the directory ``path``; ``StoreUnavailable`` if it cannot be read
    (a Secret that is not mounted yet is infrastructure trouble, not the request's)."""
    root = Path(path)
    if not root.is_dir():
        raise StoreUnavailable(f"the store credentials directory {path} is not a directory")

    def value(*names: str) -> str:
        for name in names:
            file = root / name
            if file.is_file():
                with file.open("rb") as stream:
                    return stream.read(_MAX_BYTES).decode("utf-8", "replace").removesuffix("\n")
        return ""

    gcs_key = root / GCS_KEY_FILE
    return StoreCredentials(
        aws_access_key_id=value("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=value("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=value("AWS_SESSION_TOKEN"),
        aws_region=value("AWS_REGION", "AWS_DEFAULT_REGION"),
        s3_endpoint=value("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        gcs_key_file=str(gcs_key) if gcs_key.is_file() else "",
    )
