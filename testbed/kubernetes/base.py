"""What every piece of a cluster works on: its directory and the paths in it, the record of
what it made on this machine (``state.json``, written as each thing is made, for
``cleanup_stale``), its processes, and its clients (kubectl, ctr). ``Cluster``
(``cluster.py``) adds starting and stopping it, from the modules of its pieces, which take a
``ClusterBase``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from testbed.kubernetes import pki
from testbed.kubernetes.layout import GATEWAY
from testbed.kubernetes.processes import ClusterError, Proc, tail, terminate


@dataclass
class ClusterBase:
    """One cluster's record and clients (``Cluster`` starts and stops it)."""

    root: Path
    bin_dir: Path
    keep: bool = False  # keep the directory (logs) after stop
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0
    kubelet_port: int = 0
    sysctls: dict[str, str] = field(default_factory=dict)
    iptables_rules: list[list[str]] = field(default_factory=list)
    bridge_created: bool = False
    preexisting_chains: set[tuple[str, str, str]] = field(default_factory=set)
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

    def note(self, text: str) -> None:
        print(f"[cluster] {text}", file=sys.stderr, flush=True)

    # --- processes ------------------------------------------------------------------------

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
    def from_state(cls, root: Path) -> Self:
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
