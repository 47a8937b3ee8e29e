"""The client libraries' clients for the S3 and GCS backends.

boto3 and google-cloud-storage read their own environment (endpoints, credentials, retry
mode); the few defaults chosen here depend on what the user set, which ``StoreOptions``
read once (``AWS_ENDPOINT_URL(_S3)``, ``AWS_RETRY_MODE``, ``AWS_REQUEST_CHECKSUM_CALCULATION``,
``GOOGLE_CLOUD_PROJECT``, ``STORAGE_EMULATOR_HOST``). Credentials given in the options (the
task pod's mounted Secret files) are handed to the libraries explicitly.
Imported only when an ``s3://`` or ``gs://`` store is opened.
"""

from __future__ import annotations

from typing import Any

from storage.base import Store
from storage.credentials import StoreCredentials
from storage.store_errors import StoreUnavailable
from storage.tuning import StoreOptions


def s3_store(bucket: str, prefix: str, options: StoreOptions) -> Store:
    import boto3
    from botocore.config import Config

    from storage.s3 import S3Store

    config = Config(
        request_checksum_calculation=_s3_request_checksums(options),
        s3={"addressing_style": _s3_addressing_style(options)},
        retries={} if options.s3_retry_mode_chosen else {"mode": "standard"},
        # Every request and part in flight needs its own connection: with fewer, urllib3
        # closes the ones it cannot keep ("Connection pool is full") and opens new ones.
        max_pool_connections=max(10, options.threads * options.concurrency),
    )
    session = boto3.session.Session(**_s3_session_arguments(options.credentials))
    endpoint = options.credentials.s3_endpoint if options.credentials else ""
    client = session.client("s3", config=config, endpoint_url=endpoint or None)
    return S3Store(client, bucket, prefix, options)


def _s3_session_arguments(credentials: StoreCredentials | None) -> dict[str, Any]:
    """Explicit keys and region, where given; the rest is boto3's own chain."""
    if credentials is None:
        return {}
    given = {
        "aws_access_key_id": credentials.aws_access_key_id,
        "aws_secret_access_key": credentials.aws_secret_access_key,
        "aws_session_token": credentials.aws_session_token,
        "region_name": credentials.aws_region,
    }
    return {name: value for name, value in given.items() if value}


def _s3_addressing_style(options: StoreOptions) -> str:
    """Path style with a custom endpoint: MinIO and moto do not serve bucket subdomains."""
    if options.s3_addressing_style:
        return options.s3_addressing_style
    return "path" if options.s3_endpoint_url else "auto"


def _s3_request_checksums(options: StoreOptions) -> str | None:
    """``when_required`` for an ``http://`` endpoint: there botocore signs every payload's
    SHA-256, which the server checks, so the CRC32 it adds by default (since 1.36) is a second
    pass over every part for nothing. Over HTTPS the CRC32 is what spares the SHA-256 (the
    payload goes unsigned), so botocore's default stays, as does
    ``AWS_REQUEST_CHECKSUM_CALCULATION``."""
    if options.s3_checksums_chosen:
        return None
    return "when_required" if options.s3_endpoint_url.startswith("http://") else None


def gcs_store(bucket: str, prefix: str, options: StoreOptions) -> Store:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import storage as gcs

    from storage.gcs import GCSStore

    # project=None: object calls need no project, so none is looked up.
    project = options.gcs_project or None
    key_file = options.credentials.gcs_key_file if options.credentials else ""
    try:
        if options.gcs_emulator:
            client = gcs.Client(project=project or "emulator", credentials=AnonymousCredentials())
        elif key_file:
            client = gcs.Client.from_service_account_json(key_file, project=project)
        else:
            client = gcs.Client(project=project)
    except (GoogleAuthError, ValueError, OSError) as err:
        raise StoreUnavailable(
            f"no Google credentials for gs://{bucket}: set GOOGLE_APPLICATION_CREDENTIALS or run "
            f"with a service account ({type(err).__name__})"
        ) from err
    return GCSStore(client, bucket, prefix, options)
