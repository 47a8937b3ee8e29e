"""versitygw (Versity S3 Gateway, Apache-2.0, Go): the real S3 server of the tests and benchmarks.

It serves a directory's subfolders as buckets (``posix`` backend), checks SigV4 signatures with
one root key pair, enforces ``If-None-Match: *`` (single and multipart) and uploads at several
hundred MB/s on loopback, so it neither hides our own costs nor has an emulator's races.

Usable from any harness, not only pytest::

    from testbed.versitygw import start_versitygw
    with start_versitygw("10.88.0.1", root=Path("/tmp/s3")) as s3:
        s3.endpoint, s3.access_key, s3.secret_key, s3.region   # for the clients
        s3.client().create_bucket(Bucket="b")                   # boto3, path-style
        env = s3.env()                                          # AWS_* for child processes

The binary is built once by ``testbed/build_versitygw.sh`` (``go install`` of a released
version, cached under ``~/.cache/resource-functions/versitygw-<version>/bin``); ``.ci/setup
--tests`` runs it. ``VERSITYGW_BIN`` names another binary.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.cli.launch import free_port
from testbed.process import ServerError, running

BUILD_SCRIPT = Path(__file__).with_name("build_versitygw.sh")


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint and the credentials it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    pid: int | None = None  # of the server process, when started here

    def env(self) -> dict[str, str | None]:
        """Environment (``None`` = unset) pointing boto3 and our services at this server, with
        no shared AWS config, so a developer's own setup cannot interfere."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": None,
            "AWS_PROFILE": None,
            "AWS_SESSION_TOKEN": None,
            "AWS_ENDPOINT_URL": None,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client on this server (path-style), from explicit arguments."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}),
        )


def versitygw_binary() -> Path:
    """``VERSITYGW_BIN``, or the cached build (built now if missing: about a minute)."""
    if configured := os.environ.get("VERSITYGW_BIN"):
        return Path(configured)
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ServerError(f"building versitygw failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@contextmanager
def start_versitygw(
    host: str = "127.0.0.1",
    port: int | None = None,
    *,
    root: Path,
    log: Path | None = None,
    access_key: str = "rf-test-access-key",
    secret_key: str | None = None,
    command_prefix: Sequence[str] = (),
) -> Iterator[S3Server]:
    """Run versitygw on ``host:port`` (a free port if ``None``) for the duration of the block,
    its buckets in subdirectories of ``root`` (created), its output in ``log`` (default
    ``root/../versitygw.log``). Yields once the server answers; raises ``ServerError`` with its
    output if it exits or does not answer in time (``process.START_TIMEOUT``). Stops it on leaving.
    ``command_prefix`` runs it through another command that then execs it (``ip netns exec NS``:
    give ``port`` then, as ``host`` is not this namespace's)."""
    port = port or free_port(host)
    secret_key = secret_key or secrets.token_hex(16)
    root.mkdir(parents=True, exist_ok=True)
    log = log or root.parent / f"versitygw-{port}.log"
    endpoint = f"http://{host}:{port}"
    environ = {**os.environ, "ROOT_ACCESS_KEY": access_key, "ROOT_SECRET_KEY": secret_key}
    command = [
        *command_prefix,
        str(versitygw_binary()),
        *("--port", f"{host}:{port}", "posix", str(root)),
    ]
    with running("versitygw", command, endpoint + "/", log, env=environ) as pid:
        yield S3Server(endpoint, access_key, secret_key, pid=pid)
