"""One cluster: ``start`` brings its pieces up in order (``certificates``, ``network``,
``node``, ``control_plane``), ``stop`` tears them down (``teardown``); in between, add-ons
filter with iptables chains, and images are imported and registries allowed."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

from testbed.kubernetes import (
    certificates,
    containerd_images,
    control_plane,
    network,
    node,
    teardown,
)
from testbed.kubernetes.base import ClusterBase
from testbed.kubernetes.builds import need
from testbed.kubernetes.layout import CNI_BIN
from testbed.kubernetes.processes import ClusterError

START_TIMEOUT = float(os.environ.get("RF_CLUSTER_START_TIMEOUT", "180"))


class Cluster(ClusterBase):
    """One cluster; ``start()`` then ``stop()`` (or use it as a context manager)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, images: tuple[str, ...] = ()) -> None:
        """Start every piece, import ``images`` (local Podman images) into containerd, and
        wait until the node is Ready and schedulable. On failure, tear down and raise."""
        need(
            "etcd",
            "containerd",
            "containerd-shim-runc-v2",
            "runc",
            "ctr",
            "iptables",
            "ip",
            "podman",
            "buildah",
        )
        for plugin in ("bridge", "host-local", "loopback", "portmap"):
            if not (CNI_BIN / plugin).is_file():
                raise ClusterError(f"CNI plugin {CNI_BIN / plugin} missing: run .ci/cluster")
        started = time.monotonic()
        try:
            for d in (self.pki_dir, self.logs):
                d.mkdir(parents=True, exist_ok=True)
            certificates.issue(self)
            network.create(self)
            pause = containerd_images.pause_image(self.bin_dir.parent)
            node.start_containerd(self, pause)
            # Image import (seconds for the project image) overlaps the control plane's start.
            with ThreadPoolExecutor(1) as pool:
                imported = pool.submit(self.import_images, (pause, *images))
                try:
                    control_plane.start_etcd(self)
                    control_plane.start_apiserver(self)
                    control_plane.start_controller_manager(self)
                    control_plane.start_scheduler(self)
                finally:
                    imported.result()
            control_plane.start_kube_proxy(self)
            control_plane.start_coredns(self)
            node.start_kubelet(self)
            node.wait_node_ready(self, started + START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.note(f"cluster ready in {time.monotonic() - started:.1f}s")

    def token_kubeconfig(
        self, path: Path, namespace: str, service_account: str, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates with a token of ``service_account`` (TokenRequest
        API), so whoever uses it has exactly the rights RBAC gives that account."""
        token = self.kubectl(
            "-n", namespace, "create", "token", service_account, f"--duration={duration}"
        ).strip()
        certificates.write_kubeconfig(self, path, {"token": token})
        return path

    # --- add-ons --------------------------------------------------------------------------

    def add_iptables_chain(self, table: str, hook: str, chain: str, rules: list[list[str]]) -> None:
        """A chain of ``rules`` in ``table``, jumped to at the end of the built-in ``hook``;
        part of the state, so that a stale cluster's cleanup removes it too."""
        network.add_chain(self, table, hook, chain, rules)

    def remove_iptables_chain(self, entry: list[str]) -> None:
        network.remove_chain(self, entry)

    def remove_nft_tables(self) -> None:
        """The nftables tables that stopped processes may have left behind."""
        network.remove_nft_tables(self)

    # --- images ---------------------------------------------------------------------------

    def allow_plain_http_registry(self, address: str) -> None:
        """Let the kubelet pull from ``address`` (``host:port``) over plain HTTP."""
        hosts = self.registry_hosts / address
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{address}"\n\n[host."http://{address}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )

    def import_images(self, refs: tuple[str, ...]) -> None:
        """Copy local Podman images into containerd's k8s.io namespace."""
        for ref in refs:
            if ref in self.images:
                continue
            started = time.monotonic()
            containerd_images.import_image(self.containerd_socket, ref, self.root / "images")
            self.images[ref] = ref
            self.note(f"imported {ref} in {time.monotonic() - started:.1f}s")

    # --- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Tear everything down; safe to call more than once and after a partial start."""
        teardown.tear_down(self)
