"""Run a pod spec (a dict, as ``functions.runtimes.kube.podspec.pod_spec`` builds it) with Podman,
the way the kubelet would run it, so tests exercise the real containers in the real layout.

- init containers one after the other, then the main containers; a failing init container
  stops the pod (``restartPolicy: Never``), as in Kubernetes;
- volumes are host directories under ``root``: an ``emptyDir`` as the kubelet prepares it
  (mode 0777, then, with ``fsGroup``, group ``fsGroup`` and setgid: 2777), a ``secret`` as
  read-only files (``defaultMode``, plus group read and group ``fsGroup``);
- each container's ``securityContext`` becomes Podman flags (user, supplementary ``fsGroup``,
  read-only root with no tmpfs on /tmp, dropped capabilities, no-new-privileges, privileged);
- ``env`` over ``envFrom`` (secrets), ``command`` as the entrypoint, a writable
  ``/dev/termination-log`` per container.

Only what the task pods use is translated; anything else raises ``UnsupportedSpec``.
Needs rootful Podman (host uids are container uids).
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_TIMEOUT = 180.0  # seconds per container
SECRET_DIR_MODE = 0o755


class UnsupportedSpec(ValueError):
    """The spec uses something this runner does not translate."""


@dataclass(frozen=True)
class StepResult:
    """One container's run: its exit status, output, and termination message."""

    name: str
    returncode: int
    stdout: str
    stderr: str
    termination_message: str


@dataclass(frozen=True)
class PodVolumes:
    """Host directories standing for the pod's volumes, by volume name."""

    root: Path
    paths: Mapping[str, Path]
    read_only: frozenset[str]  # secret volumes: read-only whatever the mount says


def secret_data(manifest: Mapping[str, Any]) -> dict[str, bytes]:
    """The decoded ``data`` of a Secret manifest."""
    return {key: base64.b64decode(value) for key, value in manifest.get("data", {}).items()}


def run_pod(
    spec: Mapping[str, Any],
    root: Path,
    secrets: Mapping[str, Mapping[str, bytes]],
    *,
    network: str = "host",
) -> list[StepResult]:
    """Run the pod's containers in order; the results of those that ran."""
    volumes = prepare_volumes(spec, root, secrets)
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    results: list[StepResult] = []
    for container in spec.get("initContainers", []):
        results.append(run_container(container, volumes, secrets, fs_group, network=network))
        if results[-1].returncode != 0:
            return results
    for container in spec["containers"]:
        results.append(run_container(container, volumes, secrets, fs_group, network=network))
    return results


def volume_path(root: Path, name: str) -> Path:
    """The host directory standing for volume ``name`` of a pod run under ``root``."""
    return root / "volumes" / name


def prepare_volumes(
    spec: Mapping[str, Any], root: Path, secrets: Mapping[str, Mapping[str, bytes]]
) -> PodVolumes:
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    paths: dict[str, Path] = {}
    read_only: set[str] = set()
    for volume in spec.get("volumes", []):
        path = volume_path(root, volume["name"])
        path.mkdir(parents=True)
        if "emptyDir" in volume:
            _empty_dir(path, fs_group)
        elif "secret" in volume:
            _secret_volume(path, volume["secret"], secrets, fs_group)
            read_only.add(volume["name"])
        else:
            raise UnsupportedSpec(f"volume {volume['name']}: only emptyDir and secret")
        paths[volume["name"]] = path
    return PodVolumes(root, paths, frozenset(read_only))


def _empty_dir(path: Path, fs_group: int | None) -> None:
    path.chmod(0o777)  # the kubelet's emptyDir mode
    if fs_group is not None:
        os.chown(path, -1, fs_group)
        path.chmod(0o2777)


def _secret_volume(
    path: Path,
    source: Mapping[str, Any],
    secrets: Mapping[str, Mapping[str, bytes]],
    fs_group: int | None,
) -> None:
    data = secrets.get(source["secretName"])
    if data is None:
        if source.get("optional"):
            return
        raise UnsupportedSpec(f"secret {source['secretName']} is not given")
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    mode = source.get("defaultMode", 0o644)
    for item in items:
        target = path / item["path"]
        target.write_bytes(data[item["key"]])
        target.chmod(item.get("mode", mode) | (0o440 if fs_group is not None else 0))
        if fs_group is not None:
            os.chown(target, 0, fs_group)
    path.chmod(SECRET_DIR_MODE)


def run_container(
    container: Mapping[str, Any],
    volumes: PodVolumes,
    secrets: Mapping[str, Mapping[str, bytes]],
    fs_group: int | None,
    *,
    network: str = "host",
) -> StepResult:
    name = f"rf-pod-{container['name']}-{uuid.uuid4().hex[:10]}"
    termination = volumes.root / f"termination-{container['name']}-{uuid.uuid4().hex[:6]}"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    argv = [
        "podman",
        "run",
        "--rm",
        "--pull=never",
        f"--network={network}",
        f"--name={name}",
        "--volume",
        f"{termination}:/dev/termination-log:rw",
        *security_flags(container.get("securityContext", {}), fs_group),
        *env_flags(container, secrets),
        *mount_flags(container, volumes),
    ]
    if "workingDir" in container:
        argv += ["--workdir", container["workingDir"]]
    command, args = container.get("command"), list(container.get("args", []))
    if command:
        argv += ["--entrypoint", command[0], container["image"], *command[1:], *args]
    else:
        argv += [container["image"], *args]
    try:
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=STEP_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        subprocess.run(["podman", "rm", "--force", name], check=False, capture_output=True)
        raise
    return StepResult(
        container["name"],
        done.returncode,
        done.stdout,
        done.stderr,
        termination.read_text(errors="replace"),
    )


def security_flags(context: Mapping[str, Any], fs_group: int | None) -> list[str]:
    flags: list[str] = []
    user, group = context.get("runAsUser"), context.get("runAsGroup")
    if context.get("runAsNonRoot") and not user:
        raise UnsupportedSpec("runAsNonRoot needs a numeric runAsUser here")
    if user is not None:
        flags += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if fs_group is not None:
        flags += ["--group-add", str(fs_group)]
    if context.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs on /tmp, as in k8s
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    capabilities = context.get("capabilities", {})
    flags += [f"--cap-drop={cap.lower()}" for cap in capabilities.get("drop", [])]
    flags += [f"--cap-add={cap.lower()}" for cap in capabilities.get("add", [])]
    if context.get("privileged"):
        flags.append("--privileged")
    return flags


def env_flags(
    container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]]
) -> list[str]:
    """``envFrom`` secrets first, ``env`` over them (Kubernetes' precedence)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("secretRef")
        if ref is None:
            raise UnsupportedSpec("envFrom: only secretRef")
        env.update({k: v.decode() for k, v in secrets[ref["name"]].items()})
    for item in container.get("env", []):
        if "value" not in item:
            raise UnsupportedSpec(f"env {item['name']}: only literal values")
        env[item["name"]] = item["value"]
    return [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]


def mount_flags(container: Mapping[str, Any], volumes: PodVolumes) -> list[str]:
    flags: list[str] = []
    for mount in container.get("volumeMounts", []):
        read_only = mount.get("readOnly") or mount["name"] in volumes.read_only
        mode = "ro" if read_only else "rw"
        flags += ["--volume", f"{volumes.paths[mount['name']]}:{mount['mountPath']}:{mode}"]
    return flags
