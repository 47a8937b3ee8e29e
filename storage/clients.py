"""The client libraries' clients for the S3 and GCS backends.

boto3 and google-cloud-storage read their own environment (endpoints, credentials, retry
mode); the few defaults chosen here depend on whether the user set one of those variables
(``AWS_ENDPOINT_URL(_S3)``, ``AWS_RETRY_MODE``, ``AWS_REQUEST_CHECKSUM_CALCULATION``,
``GOOGLE_CLOUD_PROJECT``, ``STORAGE_EMULATOR_HOST``), so this module, and no other in
``storage``, looks at them.
Imported only when an ``s3://`` or ``gs://`` store is opened.
"""

from __future__ import annotations

import os
from typing import Any

from storage.base import Store
from storage.errors import StoreUnavailable
from storage.options import StoreOptions


def s3_store(bucket: str, prefix: str, options: StoreOptions) -> Store:
    import boto3
    from botocore.config import Config

    from storage.s3 import S3Store

    config = Config(
        request_checksum_calculation=_s3_request_checksums(),
        s3={"addressing_style": _s3_addressing_style(options)},
        retries=_s3_retries(),
        # Every request and part in flight needs its own connection: with fewer, urllib3
        # closes the ones it cannot keep ("Connection pool is full") and opens new ones.
        max_pool_connections=max(10, options.threads * options.concurrency),
    )
    client = boto3.session.Session().client("s3", config=config)
    return S3Store(client, bucket, prefix, options)


def _s3_addressing_style(options: StoreOptions) -> str:
    """Path style with a custom endpoint: MinIO and moto do not serve bucket subdomains."""
    if options.s3_addressing_style:
        return options.s3_addressing_style
    return "path" if _custom_s3_endpoint() else "auto"


def _s3_request_checksums() -> str | None:
    """``when_required`` for an ``http://`` endpoint: there botocore signs every payload's
    SHA-256, which the server checks, so the CRC32 it adds by default (since 1.36) is a second
    pass over every part for nothing. Over HTTPS the CRC32 is what spares the SHA-256 (the
    payload goes unsigned), so botocore's default stays, as does
    ``AWS_REQUEST_CHECKSUM_CALCULATION``."""
    if os.environ.get("AWS_REQUEST_CHECKSUM_CALCULATION"):
        return None
    return "when_required" if _custom_s3_endpoint().startswith("http://") else None


def _custom_s3_endpoint() -> str:
    """The S3 endpoint URL the user configured for boto3 (MinIO, versitygw), or ""."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def _s3_retries() -> dict[str, Any]:
    # "standard" unless the user chose a mode: botocore's own default ("legacy") retries less.
    return {} if os.environ.get("AWS_RETRY_MODE") else {"mode": "standard"}


def gcs_store(bucket: str, prefix: str, options: StoreOptions) -> Store:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import storage as gcs

    from storage.gcs import GCSStore

    # project=None: object calls need no project, so none is looked up.
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    try:
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            client = gcs.Client(project=project or "emulator", credentials=AnonymousCredentials())
        else:
            client = gcs.Client(project=project)
    except GoogleAuthError as err:
        raise StoreUnavailable(
            f"no Google credentials for gs://{bucket}: set GOOGLE_APPLICATION_CREDENTIALS or run "
            f"with a service account ({err})"
        ) from err
    return GCSStore(client, bucket, prefix, options)
