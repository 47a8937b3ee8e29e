"""One cluster: its directory, its processes, what it made on this machine (recorded in
``state.json`` as it is made, for ``cleanup_stale``), and the ways to talk to it (kubectl,
ctr). ``start`` brings the pieces up in order (``certificates``, ``network``, ``node``,
``control_plane``); ``stop`` tears them down (``teardown``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from testbed.kubernetes import (
    certificates,
    containerd_images,
    control_plane,
    network,
    node,
    pki,
    teardown,
)
from testbed.kubernetes.builds import need
from testbed.kubernetes.layout import CNI_BIN, GATEWAY
from testbed.kubernetes.network import Chain
from testbed.kubernetes.processes import ClusterError, Proc, tail, terminate

START_TIMEOUT = float(os.environ.get("RF_CLUSTER_START_TIMEOUT", "180"))


@dataclass
class Cluster:
    """One cluster; ``start()`` then ``stop()`` (or use it as a context manager)."""

    root: Path
    bin_dir: Path
    keep: bool = False  # keep the directory (logs) after stop
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0
    kubelet_port: int = 0
    sysctls: dict[str, str] = field(default_factory=dict)
    iptables_rules: list[list[str]] = field(default_factory=list)
    bridge_created: bool = False
    preexisting_chains: set[Chain] = field(default_factory=set)
    made_run_dir: bool = False  # /run/containerd (runc state, shim sockets) was created by us
    owner: int = 0  # pid of the process that started the cluster (from a state file)
    images: dict[str, str] = field(default_factory=dict)
    coredns_bin: Path | None = None  # the directory of the coredns binary
    # [table, hook, chain]: iptables chains an add-on filters with (jumped to from the built-in
    # chain ``hook``), removed on stop before any process is stopped.
    iptables_chains: list[list[str]] = field(default_factory=list)
    nft_tables: list[list[str]] = field(default_factory=list)  # [family, name] a process may leave
    # Made by ``start``: the CA and the certificates of the pieces (``certificates.issue``),
    # etcd's client URL.
    ca: pki.Authority = field(init=False, repr=False, compare=False)
    apiserver_cert: pki.Pair = field(init=False, repr=False, compare=False)
    apiserver_kubelet: pki.Pair = field(init=False, repr=False, compare=False)
    kubelet_serving: pki.Pair = field(init=False, repr=False, compare=False)
    sa_keys: pki.Pair = field(init=False, repr=False, compare=False)
    etcd_url: str = field(init=False, repr=False, compare=False)

    # --- paths ----------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one per request of ``AUDITED_USERS`` and stage (``ResponseStarted`` for a
        watch, ``ResponseComplete``), with microsecond timestamps."""
        return self.logs / "audit.log"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def registry_hosts(self) -> Path:
        return self.root / "containerd" / "certs.d"

    @property
    def server(self) -> str:
        return f"https://{GATEWAY}:{self.api_port}"

    @property
    def gateway(self) -> str:
        return GATEWAY

    # --- start ----------------------------------------------------------------------------

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

    def note(self, text: str) -> None:
        print(f"[cluster] {text}", file=sys.stderr, flush=True)

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

    # --- processes and add-ons ------------------------------------------------------------

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> Proc:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        proc = Proc(name, popen.pid, log, popen, stop_signal)
        self.procs.append(proc)
        self.save_state()
        return proc

    def end(self, proc: Proc) -> None:
        """Stop one add-on before the cluster stops (a test turns it off)."""
        terminate(proc)
        self.procs.remove(proc)
        self.save_state()

    def add_iptables_chain(self, table: str, hook: str, chain: str, rules: list[list[str]]) -> None:
        """A chain of ``rules`` in ``table``, jumped to at the end of the built-in ``hook``;
        part of the state, so that a stale cluster's cleanup removes it too."""
        network.add_chain(self, table, hook, chain, rules)

    def remove_iptables_chain(self, entry: list[str]) -> None:
        network.remove_chain(self, entry)

    def remove_nft_tables(self) -> None:
        """The nftables tables that stopped processes may have left behind."""
        network.remove_nft_tables(self)

    # --- state ----------------------------------------------------------------------------

    def save_state(self) -> None:
        """What ``stop`` needs, for ``cleanup_stale`` after the owner died without stopping."""
        state = {
            "owner": os.getpid(),
            "bin_dir": str(self.bin_dir),
            "api_port": self.api_port,
            "procs": [[p.name, p.pid, p.stop_signal] for p in self.procs],
            "sysctls": self.sysctls,
            "iptables_rules": self.iptables_rules,
            "bridge_created": self.bridge_created,
            "preexisting_chains": sorted(self.preexisting_chains),
            "made_run_dir": self.made_run_dir,
            "iptables_chains": self.iptables_chains,
            "nft_tables": self.nft_tables,
        }
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def from_state(cls, root: Path) -> Cluster:
        state = json.loads((root / "state.json").read_text())
        cluster = cls(
            root=root,
            bin_dir=Path(state["bin_dir"]),
            api_port=state["api_port"],
            sysctls=state["sysctls"],
            iptables_rules=state["iptables_rules"],
            bridge_created=state["bridge_created"],
            preexisting_chains={tuple(c) for c in state["preexisting_chains"]},
            made_run_dir=state["made_run_dir"],
            iptables_chains=state.get("iptables_chains", []),
            nft_tables=state.get("nft_tables", []),
        )
        cluster.procs = [
            Proc(
                name,
                pid,
                root / "logs" / f"{name}.log",
                stop_signal=rest[0] if rest else signal.SIGTERM,
            )
            for name, pid, *rest in state["procs"]
        ]
        cluster.owner = state["owner"]
        return cluster

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

    # --- clients --------------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
        )

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
    ) -> str:
        """kubectl's stdout; on failure ``ClusterError`` (or "" when ``check`` is false)."""
        done = self.run_kubectl(*args, stdin=stdin, kubeconfig=kubeconfig)
        if check and done.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout if done.returncode == 0 else ""

    def run_kubectl(
        self, *args: str, stdin: str | None = None, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin (or ``kubeconfig``'s user), its whole result: for callers
        that report its stderr or retry on failure."""
        return subprocess.run(
            [
                str(self.bin_dir / "kubectl"),
                "--kubeconfig",
                str(kubeconfig or self.admin_kubeconfig),
                *args,
            ],
            capture_output=True,
            text=True,
            input=stdin,
            check=False,
        )

    def diagnostics(self, lines: int = 40) -> str:
        """The tail of every component's log, for a failing test's report."""
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{tail(p.log, lines)}" for p in self.procs)

    # --- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Tear everything down; safe to call more than once and after a partial start."""
        teardown.tear_down(self)
