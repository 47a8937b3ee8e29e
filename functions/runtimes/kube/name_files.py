"""The name files of a task pod's ``stage`` and ``collect`` steps (``TASK_NAME_FILES``).

The kubelet mounts one ``/etc/hosts`` per pod into every container, and the container runtime
one ``/etc/resolv.conf``, both writable by a root container: the resource step could point the
store's or the reply relay's name anywhere before ``collect`` resolves it. So, when the
function runs in a pod of the cluster its tasks run in, ``stage`` and ``collect`` get
read-only copies of the function's own two files (keys of the run's Secret, mounted with
``subPath``, which the kubelet and the runtime leave alone): they resolve exactly as the
function does. Elsewhere (on a host, or with a kubeconfig from outside) the function's files
mean nothing in a pod, so nothing is pinned.

The copies are rendered from what the function read at start, line by line, keeping only
resolver data (addresses, names, options; no comment, nothing else), so nothing but that can
travel in them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from functions.errors import ConfigError
from functions.steps.pod_contract import ETC_HOSTS, ETC_RESOLV_CONF

MODES = ("auto", "off")  # TASK_NAME_FILES
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
MAX_FILE_BYTES = 64 * 1024  # each rendered file: the run's Secret holds at most 1 MiB
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
_OPTION = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
HEADER = "# resource-functions: the function's own {file}, pinned for this step\n"


@dataclass(frozen=True)
class NameFiles:
    """The two files' rendered text."""

    hosts: str
    resolv_conf: str


def in_cluster(environ: Mapping[str, str], token: Path = SERVICE_ACCOUNT_TOKEN) -> bool:
    """Whether the function runs in a pod, the way the Kubernetes client decides to use its
    in-cluster configuration (which then wins over any kubeconfig): the API's address in the
    env and a service-account token mounted."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    return bool(host and port) and token.is_file()


def wanted(mode: str, environ: Mapping[str, str], token: Path = SERVICE_ACCOUNT_TOKEN) -> bool:
    """``TASK_NAME_FILES``: ``auto`` pins the files when the function runs in the cluster;
    ``off`` never."""
    return mode == "auto" and in_cluster(environ, token)


def read_own(hosts: Path = Path(ETC_HOSTS), resolv_conf: Path = Path(ETC_RESOLV_CONF)) -> NameFiles:
    """The function's own files, rendered (read once, at start)."""
    try:
        return render(hosts.read_text(errors="replace"), resolv_conf.read_text(errors="replace"))
    except OSError as err:
        raise ConfigError(f"TASK_NAME_FILES: cannot read the function's name files: {err}") from err


def render(hosts: str, resolv_conf: str, own_hostname: str | None = None) -> NameFiles:
    """Both files; ``own_hostname`` (default: this host's name) is left out of ``hosts``: the
    kubelet's line for the function's own pod means nothing in a task pod."""
    files = NameFiles(
        render_hosts(hosts, socket.gethostname() if own_hostname is None else own_hostname),
        render_resolv_conf(resolv_conf),
    )
    for name, text in ((ETC_HOSTS, files.hosts), (ETC_RESOLV_CONF, files.resolv_conf)):
        if len(text.encode()) > MAX_FILE_BYTES:
            raise ConfigError(
                f"TASK_NAME_FILES: the function's {name} is over {MAX_FILE_BYTES} bytes once "
                "rendered; set TASK_NAME_FILES=off"
            )
    if "nameserver" not in files.resolv_conf:
        raise ConfigError(
            f"TASK_NAME_FILES: the function's {ETC_RESOLV_CONF} names no name server; "
            "set TASK_NAME_FILES=off"
        )
    return files


def render_hosts(text: str, own_hostname: str = "") -> str:
    """``address name...`` lines whose address is an IP address and whose names are host
    names (without ``own_hostname``); comments and anything else dropped."""
    lines = [HEADER.format(file=ETC_HOSTS)]
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2 or not _address(fields[0]):
            continue
        names = [n for n in fields[1:] if _NAME.match(n) and n != own_hostname]
        if names:
            lines.append(" ".join([fields[0], *names]) + "\n")
    return "".join(lines)


def render_resolv_conf(text: str) -> str:
    """``nameserver`` (an IP address), ``search``/``domain`` (names) and ``options`` lines;
    comments and anything else dropped."""
    lines = [HEADER.format(file=ETC_RESOLV_CONF)]
    for line in text.splitlines():
        fields = re.split(r"[#;]", line, maxsplit=1)[0].split()
        if not fields:
            continue
        keyword, values = fields[0], fields[1:]
        if keyword == "nameserver" and len(values) == 1 and _address(values[0]):
            kept = values
        elif keyword in ("search", "domain"):
            kept = [v for v in values if _NAME.match(v)]
        elif keyword == "options":
            kept = [v for v in values if _OPTION.match(v)]
        else:
            continue
        if kept:
            lines.append(" ".join([keyword, *kept]) + "\n")
    return "".join(lines)


def _address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is allowed
    except ValueError:
        return False
    return True


def from_settings(mode: str, environ: Mapping[str, str] | None = None) -> NameFiles | None:
    """What to pin for ``TASK_NAME_FILES=mode``, or None (read at start)."""
    return read_own() if wanted(mode, os.environ if environ is None else environ) else None
