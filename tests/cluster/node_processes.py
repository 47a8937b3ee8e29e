"""The processes of a pod's container, seen from this machine: the test cluster's one node
runs here, so a container's processes are this machine's, in its cgroup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from testbed.kubernetes.processes import processes


def container_processes(container: str) -> Iterator[tuple[Path, str]]:
    """``/proc/<pid>`` of each process in the cgroup of containerd's container ``container``
    (its id), with the text of its ``cgroup`` file; a process that ends meanwhile is left out."""
    for proc, groups in processes("cgroup"):
        if container.encode() in groups:
            yield proc, groups.decode()
