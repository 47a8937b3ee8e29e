"""A real single-node Kubernetes on this machine, for the end-to-end tests (and by hand).

    python -m tests.cluster.up            # start, wait for the node, print how to use it,
                                          # tear everything down on Ctrl-C / SIGTERM
    python -m tests.cluster.up --check    # start, wait for the node, tear down, exit

Pieces, each a process of this machine started here (no systemd, nothing left behind):

    etcd                     Debian's etcd-server, on 127.0.0.1
    kube-apiserver           x509 + service-account tokens, Node,RBAC authorization, on the
                             bridge's host-side address (the gateway), where pods reach it
    kube-controller-manager  Job, garbage-collector, TTL, service-account-token ... controllers
    kube-scheduler
    containerd               Debian's, CRI with runc and cgroupfs, state under the cluster dir,
                             sandbox image = a locally built pause image
    kubelet                  cgroupfs, failCgroupV1: false, failSwapOn: false
    kube-proxy               iptables mode: Service IPs work from pods and from this machine
    coredns                  cluster DNS for cluster.local on the gateway; nothing else resolves

The Kubernetes binaries come from ``tests/cluster/build.sh`` (``go build`` of the
k8s.io/kubernetes module, cached under ``~/.cache/resource-functions/kubernetes/<version>``),
CoreDNS from ``tests/cluster/build_knative.sh``.

Network: pods live on the CNI bridge ``rfcni0`` (Debian's bridge + host-local plugins) with the
private subnet 10.244.0.0/24 that exists only inside this machine. The bridge's host-side
address (10.244.0.1, the node IP) is an address of this machine: pods reach servers bound to it
(the tests' S3, the apiserver, the cluster DNS). Pods get a route to the subnet and one to the
Service range (kube-proxy translates it on this machine), no default route, and the host
forwards nothing from or to the bridge, so they can reach nothing else.

Tear-down (``Cluster.stop``, also on a failed start): pods stopped, kubelet, containerd and the
container shims killed (by pid), mounts under the cluster dir unmounted, the bridge and the
iptables rules removed, the kubelet's cgroups removed, the kernel settings the kubelet changed
restored, the directory deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import requests

from functions.cli.launch import free_port
from tests.cluster import containerd_images, pki

HERE = Path(__file__).resolve().parent
K8S_VERSION = os.environ.get("K8S_VERSION", "v1.34.4")
NODE_NAME = "rf-node"
BRIDGE = os.environ.get("RF_CLUSTER_BRIDGE", "rfcni0")
POD_SUBNET = os.environ.get("RF_CLUSTER_POD_SUBNET", "10.244.0.0/24")
GATEWAY = os.environ.get("RF_CLUSTER_GATEWAY", "10.244.0.1")
SERVICE_RANGE = "10.96.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
SERVICE_IP = "10.96.0.1"
CNI_BIN = Path(os.environ.get("RF_CLUSTER_CNI_BIN", "/usr/lib/cni"))
# Kernel settings the kubelet sets when protectKernelDefaults is false; restored on stop.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
RUN_DIR = Path("/run/containerd")
CORE_PROCS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kube-proxy",
    "coredns",
    "kubelet",
)
START_TIMEOUT = float(os.environ.get("RF_CLUSTER_START_TIMEOUT", "180"))
# The API requests the audit log records (``Cluster.audit_log``): the functions' ServiceAccount
# (knative/rbac.yaml), whose requests per run the load test counts. Nobody else's: the
# controllers' leader elections alone would write lines every second.
AUDITED_USERS = ("system:serviceaccount:resource-functions:resource-functions",)


class ClusterError(RuntimeError):
    """A piece of the cluster failed to start; the message ends with its log."""


def build_binaries() -> Path:
    """The directory of the four Kubernetes binaries (built on first use: minutes)."""
    done = subprocess.run(
        ["bash", str(HERE / "build.sh")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "K8S_VERSION": K8S_VERSION},
        check=False,
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/cluster/build.sh exited with status {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


def _need(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise ClusterError(
            f"missing {', '.join(missing)}: run .ci/cluster (installs "
            "containerd, etcd-server, containernetworking-plugins, iptables)"
        )


@dataclass
class Proc:
    """A process of the cluster: started here (``popen``), or found in the state file of a
    cluster whose owner died (``pid`` only, checked against its command line before use)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen | None = None
    stop_signal: int = signal.SIGTERM  # the signal on which it cleans up after itself

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return _pid_runs(self.pid, self.name)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None


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
    preexisting_chains: set[tuple[str, str, str]] = field(default_factory=set)
    made_run_dir: bool = False  # /run/containerd (runc state, shim sockets) was created by us
    owner: int = 0  # pid of the process that started the cluster (from a state file)
    images: dict[str, str] = field(default_factory=dict)
    coredns_bin: Path | None = None  # the directory of the coredns binary
    # [table, hook, chain]: iptables chains an add-on filters with (jumped to from the built-in
    # chain ``hook``), removed on stop before any process is stopped.
    iptables_chains: list[list[str]] = field(default_factory=list)
    nft_tables: list[list[str]] = field(default_factory=list)  # [family, name] a process may leave

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
        _need(
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
            self._pki()
            self._network()
            pause = containerd_images.pause_image(self.bin_dir.parent)
            self._containerd(pause)
            # Image import (seconds for the project image) overlaps the control plane's start.
            with ThreadPoolExecutor(1) as pool:
                imported = pool.submit(self.import_images, (pause, *images))
                try:
                    self._etcd()
                    self._apiserver()
                    self._controller_manager()
                    self._scheduler()
                finally:
                    imported.result()
            self._kube_proxy()
            self._coredns()
            self._kubelet()
            self._wait_node_ready(started + START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.note(f"cluster ready in {time.monotonic() - started:.1f}s")

    def note(self, text: str) -> None:
        print(f"[cluster] {text}", file=sys.stderr, flush=True)

    def _pki(self) -> None:
        ca = pki.Authority(self.pki_dir)
        self.ca = ca
        self.apiserver_cert = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            ips=("127.0.0.1", SERVICE_IP, GATEWAY),
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self.apiserver_kubelet = ca.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet",
            orgs=("system:masters",),
            client=True,
        )
        self.kubelet_serving = ca.issue(
            "kubelet-serving", NODE_NAME, server=True, ips=(GATEWAY,), dns=(NODE_NAME,)
        )
        self.sa_keys = ca.service_account_keys()
        clients = {
            "admin": ("rf-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "kubelet": (f"system:node:{NODE_NAME}", ("system:nodes",)),
            # Bound to the system:node-proxier ClusterRole by default.
            "kube-proxy": ("system:kube-proxy", ()),
        }
        for name, (cn, orgs) in clients.items():
            pair = ca.issue(f"{name}-client", cn, orgs=orgs, client=True)
            self._write_kubeconfig(
                self.root / f"{name}.kubeconfig",
                {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
            )

    def _write_kubeconfig(self, path: Path, user: dict[str, str]) -> None:
        # api_port is chosen here, before the apiserver starts: every kubeconfig names it.
        if not self.api_port:
            self.api_port = free_port()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "rf",
            "clusters": [
                {
                    "name": "rf",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca.cert)},
                }
            ],
            "users": [{"name": "rf", "user": user}],
            "contexts": [{"name": "rf", "context": {"cluster": "rf", "user": "rf"}}],
        }
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)

    def token_kubeconfig(
        self, path: Path, namespace: str, service_account: str, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates with a token of ``service_account`` (TokenRequest
        API), so whoever uses it has exactly the rights RBAC gives that account."""
        token = self.kubectl(
            "-n", namespace, "create", "token", service_account, f"--duration={duration}"
        ).strip()
        self._write_kubeconfig(path, {"token": token})
        return path

    # --- network --------------------------------------------------------------------------

    def _network(self) -> None:
        """The CNI bridge with the gateway address, created here so that servers can bind to
        that address before any pod exists; the bridge plugin adopts it."""
        prefix = POD_SUBNET.split("/")[1]
        shown = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False)
        if shown.returncode == 0:
            raise ClusterError(
                f"bridge {BRIDGE} exists already: another test cluster is "
                f"running, or one was not torn down (ip link delete {BRIDGE})"
            )
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        self.bridge_created = True
        self._save_state()
        _run(["ip", "addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        # Pods may talk to this machine (and to each other) only: drop anything the host
        # would forward between the bridge and another interface.
        for rule in (
            ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"],
            ["FORWARD", "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP"],
        ):
            _run(["iptables", "-w", "-I", *rule])
            self.iptables_rules.append(rule)
            self._save_state()
        cni_dir = self.root / "cni" / "net.d"
        cni_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "cniVersion": "0.4.0",
            "name": "rf-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    # The subnet's route and the Service range's (kube-proxy DNATs it on this
                    # machine), no default route.
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.root / "cni" / "ipam"),
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                        "routes": [{"dst": SERVICE_RANGE}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni_dir / "10-rf-pods.conflist").write_text(json.dumps(conf, indent=1))

    # --- control plane --------------------------------------------------------------------

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
        self._save_state()
        return proc

    def end(self, proc: Proc) -> None:
        """Stop one add-on before the cluster stops (a test turns it off)."""
        _terminate(proc)
        self.procs.remove(proc)
        self._save_state()

    def add_iptables_chain(self, table: str, hook: str, chain: str, rules: list[list[str]]) -> None:
        """A chain of ``rules`` in ``table``, jumped to at the end of the built-in ``hook``;
        part of the state, so that a stale cluster's cleanup removes it too."""
        entry = [table, hook, chain]
        self.remove_iptables_chain(entry)  # left by a cluster whose state was lost
        self.iptables_chains.append(entry)
        self._save_state()
        _run(["iptables", "-w", "-t", table, "-N", chain])
        for rule in rules:
            _run(["iptables", "-w", "-t", table, "-A", chain, *rule])
        _run(["iptables", "-w", "-t", table, "-A", hook, "-j", chain])

    def remove_iptables_chain(self, entry: list[str]) -> None:
        table, hook, chain = entry
        ipt = ["iptables", "-w", "-t", table]
        delete = [*ipt, "-D", hook, "-j", chain]
        while subprocess.run(delete, capture_output=True, check=False).returncode == 0:
            pass
        subprocess.run([*ipt, "-F", chain], capture_output=True, check=False)
        subprocess.run([*ipt, "-X", chain], capture_output=True, check=False)
        if entry in self.iptables_chains:
            self.iptables_chains.remove(entry)
            self._save_state()

    def remove_nft_tables(self) -> None:
        """The nftables tables that stopped processes may have left behind."""
        if shutil.which("nft"):
            for family, name in self.nft_tables:
                subprocess.run(
                    ["nft", "delete", "table", family, name], capture_output=True, check=False
                )
        self.nft_tables.clear()

    def _save_state(self) -> None:
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

    def _wait(self, proc: Proc, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ClusterError(
                    f"{proc.name} exited with {proc.returncode} before {what}:\n{_tail(proc.log)}"
                )
            try:
                if ready():
                    return
            except Exception as err:  # noqa: BLE001 (not ready yet: keep polling)
                last_error = err
            time.sleep(0.2)
        raise ClusterError(
            f"{proc.name}: not {what} after {timeout}s (last probe error: "
            f"{last_error!r}):\n{_tail(proc.log)}"
        )

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self.spawn(
            "etcd",
            [
                "etcd",
                "--name",
                "rf",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"rf=http://127.0.0.1:{peer}",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{free_port()}",
                "--unsafe-no-fsync",
                "--snapshot-count",
                "10000",
                "--log-level",
                "warn",
            ],
        )
        self._wait(proc, lambda: requests.get(self.etcd_url + "/health", timeout=1).ok, "healthy")

    def _audit_policy(self) -> Path:
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "users": list(AUDITED_USERS)},
                {"level": "None"},
            ],
        }
        path = self.root / "audit-policy.json"
        path.write_text(json.dumps(policy))
        return path

    def _apiserver(self) -> None:
        p = self.pki_dir
        proc = self.spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--etcd-servers",
                self.etcd_url,
                # On the gateway only: pods reach it there (the lease reconciler makes that the
                # endpoint of the kubernetes Service), and nothing outside this machine does.
                "--bind-address",
                GATEWAY,
                "--secure-port",
                str(self.api_port),
                "--advertise-address",
                GATEWAY,
                "--endpoint-reconciler-type",
                "lease",
                "--tls-cert-file",
                str(self.apiserver_cert.cert),
                "--tls-private-key-file",
                str(self.apiserver_cert.key),
                "--client-ca-file",
                str(self.ca.cert),
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                str(self.sa_keys.cert),
                "--service-account-signing-key-file",
                str(self.sa_keys.key),
                "--service-cluster-ip-range",
                SERVICE_RANGE,
                "--authorization-mode",
                "Node,RBAC",
                "--enable-admission-plugins",
                "NodeRestriction",
                "--allow-privileged=true",
                "--kubelet-client-certificate",
                str(self.apiserver_kubelet.cert),
                "--kubelet-client-key",
                str(self.apiserver_kubelet.key),
                "--kubelet-certificate-authority",
                str(self.ca.cert),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--profiling=false",
                "--v=1",
                # Its key-count refresher polls the watch cache at etcd's newest revision; etcd
                # 3.4 sends no watch progress notifications, so that fails every second or so
                # ("Error getting keys ... Too large resource version"): noise, turned off.
                "--feature-gates",
                "SizeBasedListCostEstimate=false",
                "--cert-dir",
                str(p / "apiserver-generated"),
                "--audit-policy-file",
                str(self._audit_policy()),
                "--audit-log-path",
                str(self.audit_log),
                "--audit-log-format",
                "json",
                "--audit-log-mode",
                "blocking",
            ],
        )
        admin = self.ca.issue("probe-client", "rf-probe", orgs=("system:masters",), client=True)
        # verify= per request: a Session's verify loses to REQUESTS_CA_BUNDLE in the env.
        self._wait(
            proc,
            lambda: (
                requests.get(
                    self.server + "/readyz",
                    timeout=2,
                    cert=(str(admin.cert), str(admin.key)),
                    verify=str(self.ca.cert),
                ).ok
            ),
            "ready",
            timeout=90,
        )

    def _controller_manager(self) -> None:
        kubeconfig = str(self.root / "controller-manager.kubeconfig")
        self.spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                "--kubeconfig",
                kubeconfig,
                "--authentication-kubeconfig",
                kubeconfig,
                "--authorization-kubeconfig",
                kubeconfig,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port()),
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                "--service-account-private-key-file",
                str(self.sa_keys.key),
                "--root-ca-file",
                str(self.ca.cert),
                "--cluster-signing-cert-file",
                str(self.ca.cert),
                "--cluster-signing-key-file",
                str(self.ca.key),
                "--allocate-node-cidrs=false",
                "--cluster-name",
                "rf-test",
                "--cert-dir",
                str(self.pki_dir / "controller-manager-generated"),
                "--v=1",
            ],
        )

    def _scheduler(self) -> None:
        kubeconfig = str(self.root / "scheduler.kubeconfig")
        self.spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                "--kubeconfig",
                kubeconfig,
                "--authentication-kubeconfig",
                kubeconfig,
                "--authorization-kubeconfig",
                kubeconfig,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port()),
                "--leader-elect=false",
                "--cert-dir",
                str(self.pki_dir / "scheduler-generated"),
                "--v=1",
            ],
        )

    def _kube_proxy(self) -> None:
        # KUBE-* chains made from here on (kube-proxy's, the kubelet's) are removed on stop.
        self.preexisting_chains = _kube_chains()
        health = free_port()
        proc = self.spawn(
            "kube-proxy",
            [
                str(self.bin_dir / "kube-proxy"),
                "--kubeconfig",
                str(self.root / "kube-proxy.kubeconfig"),
                "--hostname-override",
                NODE_NAME,
                "--proxy-mode",
                "iptables",
                "--cluster-cidr",
                POD_SUBNET,
                # Root here may not change the conntrack sysctls; leave them as they are.
                "--conntrack-max-per-core",
                "0",
                "--iptables-localhost-nodeports=false",
                "--healthz-bind-address",
                f"127.0.0.1:{health}",
                "--metrics-bind-address",
                f"127.0.0.1:{free_port()}",
                "--v=1",
            ],
        )
        self._wait(
            proc, lambda: requests.get(f"http://127.0.0.1:{health}/livez", timeout=1).ok, "serving"
        )

    def _coredns(self) -> None:
        """Cluster DNS on the gateway's port 53: ``cluster.local`` and reverse lookups from the
        API; any other name is REFUSED (nothing may leave this machine)."""
        if self.coredns_bin is None:
            raise ClusterError("no coredns binary: run tests/cluster/build_knative.sh")
        ready = free_port()
        corefile = self.root / "Corefile"
        corefile.write_text(f"""\
.:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.admin_kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")
        proc = self.spawn("coredns", [str(self.coredns_bin / "coredns"), "-conf", str(corefile)])
        self._wait(
            proc, lambda: requests.get(f"http://127.0.0.1:{ready}/ready", timeout=1).ok, "ready"
        )

    # --- node -----------------------------------------------------------------------------

    def _containerd(self, sandbox_image: str) -> None:
        base = self.root / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  netns_mounts_under_state_dir = true
  # This machine's root lacks CAP_SYS_RESOURCE: no oom_score_adj below containerd's own
  # (the sandbox's -998 fails in runc with "failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{os.environ.get("RF_CLUSTER_RUNC") or shutil.which("runc")}"

[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.root / "cni" / "net.d"}"

# Registries the tests serve (plain HTTP on the gateway) are named here, one hosts.toml
# each (Cluster.allow_plain_http_registry); containerd reads the directory at every pull.
[{cri}.registry]
  config_path = "{self.registry_hosts}"
"""
        (base / "config.toml").write_text(config)
        # containerd 1.6 keeps runc's state and the shims' sockets under /run/containerd
        # whatever its own state directory is; remove what we made there on stop.
        self.made_run_dir = not RUN_DIR.exists()
        self._save_state()
        proc = self.spawn(
            "containerd",
            ["containerd", "--config", str(base / "config.toml"), "--log-level", "info"],
        )
        self._wait(proc, lambda: self.ctr("version", check=False).returncode == 0, "serving")

    @property
    def registry_hosts(self) -> Path:
        return self.root / "containerd" / "certs.d"

    def allow_plain_http_registry(self, address: str) -> None:
        """Let the kubelet pull from ``address`` (``host:port``) over plain HTTP."""
        hosts = self.registry_hosts / address
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{address}"\n\n[host."http://{address}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
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

    def _kubelet(self) -> None:
        kubelet_dir = self.root / "kubelet"
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_port = free_port(GATEWAY)
        resolv = self.root / "resolv.conf"
        # Name server of pods outside the cluster DNS policy: CoreDNS on the gateway too. (An
        # empty file would make containerd copy this machine's /etc/resolv.conf into pods.)
        resolv.write_text(f"nameserver {GATEWAY}\noptions ndots:1\n")
        socket_url = f"unix://{self.containerd_socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": GATEWAY,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self.kubelet_serving.cert),
            "tlsPrivateKeyFile": str(self.kubelet_serving.key),
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": socket_url,
            "imageServiceEndpoint": socket_url,
            "resolvConf": str(resolv),
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [GATEWAY],
            "podLogsDir": str(self.root / "pod-logs"),
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 110,  # the kubelet's default: the load test runs 20 Jobs beside Knative
            "syncFrequency": "10s",
            "fileCheckFrequency": "20s",
            "nodeStatusUpdateFrequency": "5s",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
        }
        (kubelet_dir / "config.json").write_text(json.dumps(config, indent=1))
        self._save_sysctls()
        self._save_state()
        self.spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                "--config",
                str(kubelet_dir / "config.json"),
                "--kubeconfig",
                str(self.root / "kubelet.kubeconfig"),
                "--root-dir",
                str(kubelet_dir),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                GATEWAY,
                "--v=2",
            ],
        )

    def _save_sysctls(self) -> None:
        for name in KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                self.sysctls[name] = (Path("/proc/sys") / name).read_text().strip()

    def _wait_node_ready(self, deadline: float) -> None:
        kubelet = next(p for p in self.procs if p.name == "kubelet")

        def ready() -> bool:
            out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if not out:
                return False
            node = json.loads(out)
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = node.get("spec", {}).get("taints") or []
            return conditions.get("Ready") == "True" and not taints

        self._wait(kubelet, ready, "Ready (node)", timeout=max(5.0, deadline - time.monotonic()))

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
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{_tail(p.log, lines)}" for p in self.procs)

    # --- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Tear everything down; safe to call more than once and after a partial start."""
        by_name = {p.name: p for p in self.procs}
        for entry in list(self.iptables_chains):  # no filter may outlive the process it needs
            self.remove_iptables_chain(entry)
        for proc in self.procs:  # add-ons started with spawn (the test KIngress) go first
            if proc.name not in CORE_PROCS:
                _terminate(proc)
        self.remove_nft_tables()
        if "kubelet" in by_name and "kube-apiserver" in by_name:
            self._delete_pods()
        for name in ("kubelet",):
            if name in by_name:
                _terminate(by_name[name])
        if "containerd" in by_name:
            self._kill_containers()
            _terminate(by_name["containerd"])
        self._kill_shims()
        self._unmount()
        for name in (
            "coredns",
            "kube-proxy",
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd",
        ):
            if name in by_name:
                _terminate(by_name[name])
        if "kube-proxy" in by_name:  # its iptables chains and rules
            subprocess.run(
                [str(self.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True, check=False
            )
        self.procs.clear()
        self._remove_cgroups()
        if self.made_run_dir:
            _remove_empty_dirs(RUN_DIR)
            self.made_run_dir = False
        self._restore_sysctls()
        if "kubelet" in by_name or "kube-proxy" in by_name:
            self._remove_kubelet_chains()
        for rule in reversed(self.iptables_rules):
            subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, check=False)
        self.iptables_rules.clear()
        if self.bridge_created:
            subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
            self.bridge_created = False
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        else:  # only logs remain: nothing for cleanup_stale to do
            (self.root / "state.json").unlink(missing_ok=True)

    def _delete_pods(self) -> None:
        """Let the kubelet stop every pod (CNI DEL releases its address and veth)."""
        with contextlib.suppress(Exception):
            self.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                "--all",
                "--grace-period=0",
                "--force",
                "--wait=false",
                check=False,
            )
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                listed = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
                if len(listed) == 0:
                    break
                time.sleep(0.5)

    def _kill_containers(self) -> None:
        with contextlib.suppress(Exception):
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            time.sleep(0.5)
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", task, check=False)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd by design: kill ours (those
        whose command line names this cluster's directory), by pid."""
        marker = str(self.root).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _unmount(self) -> None:
        """Unmount everything under the cluster directory, deepest first."""
        root = str(self.root)
        for _ in range(3):
            mounts = [
                line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            ]
            ours = sorted(
                {m for m in mounts if m == root or m.startswith(root + "/")}, key=len, reverse=True
            )
            if not ours:
                return
            for mount in ours:
                done = subprocess.run(["umount", mount], capture_output=True, check=False)
                if done.returncode != 0:
                    subprocess.run(["umount", "-l", mount], capture_output=True, check=False)

    def _remove_cgroups(self) -> None:
        """The kubelet's cgroup tree (kubepods) in every v1 hierarchy, leaves first."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for path in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def _remove_kubelet_chains(self) -> None:
        """The kubelet's iptables chains (KUBE-FIREWALL and its jumps from INPUT/OUTPUT, the
        canary and hint chains) and any kube-proxy left, unless they existed before this
        cluster started them."""
        for tool, table, chain in sorted(_kube_chains() - self.preexisting_chains):
            if (tool, table, chain) == (tool, "filter", "KUBE-FIREWALL"):
                for hook in ("INPUT", "OUTPUT"):
                    while (
                        subprocess.run(
                            [tool, "-w", "-t", table, "-D", hook, "-j", chain],
                            capture_output=True,
                            check=False,
                        ).returncode
                        == 0
                    ):
                        pass
            subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False)

    def _restore_sysctls(self) -> None:
        for name, value in self.sysctls.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)
        self.sysctls.clear()


def _remove_empty_dirs(top: Path) -> None:
    """``top`` and the directories below it, if (once emptied of empty directories) empty."""
    if not top.is_dir():
        return
    for path in sorted(
        (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    ):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def _kube_chains() -> set[tuple[str, str, str]]:
    """(tool, table, chain) of every KUBE-* iptables chain on this machine."""
    found = set()
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            done = subprocess.run(
                [tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            for line in done.stdout.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "-N" and parts[1].startswith("KUBE-"):
                    found.add((tool, table, parts[1]))
    return found


def _pid_runs(pid: int, name: str) -> bool:
    """Process ``pid`` exists and runs the program ``name`` (not a recycled pid)."""
    try:
        argv0 = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name == name


def _terminate(proc: Proc, timeout: float = 15.0) -> None:
    if proc.popen is not None:
        if proc.popen.poll() is not None:
            return
        proc.popen.send_signal(proc.stop_signal)
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)
        return
    for sig, wait in ((proc.stop_signal, timeout), (signal.SIGKILL, 5.0)):
        if not proc.alive():
            return
        with contextlib.suppress(OSError):
            os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def cluster_parent() -> Path:
    return Path(os.environ.get("RF_CLUSTER_TMP", "/var/tmp"))


def cleanup_stale(parent: Path | None = None) -> list[Path]:
    """Tear down the clusters whose owner process is gone (a test run killed with SIGKILL,
    a machine handed over mid-run): processes, mounts, bridge, iptables, cgroups, sysctls.
    Returns their directories."""
    cleaned = []
    for root in sorted((parent or cluster_parent()).glob("rf-cluster-*")):
        if not (root / "state.json").is_file():
            continue
        try:
            cluster = Cluster.from_state(root)
        except (ValueError, KeyError, OSError):
            continue
        if cluster.owner != os.getpid() and Path(f"/proc/{cluster.owner}").exists():
            continue  # its owner still runs: not stale
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        cleaned.append(root)
    return cleaned


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_knative() -> dict[str, Path]:
    """Directories of the Knative binaries and manifests (``eventing``, ``serving``), of
    ``coredns`` and of ``kingress`` (built on first use: minutes)."""
    return build_tools("build_knative.sh")


def build_tools(script: str) -> dict[str, Path]:
    """Run ``tests/cluster/<script>`` (a build, cached by the script); the ``NAME=DIR`` lines
    it prints, as a dict."""
    done = subprocess.run(
        ["bash", str(HERE / script)], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/cluster/{script} exited with status {done.returncode}")
    return {
        name: Path(path)
        for name, _, path in (
            line.partition("=") for line in done.stdout.splitlines() if "=" in line
        )
    }


def new_cluster(keep: bool = False) -> Cluster:
    """A cluster (not started) in a new directory; stale clusters are torn down first."""
    bin_dir = build_binaries()
    tools = build_knative()
    for root in cleanup_stale():
        print(f"[cluster] tore down the stale cluster in {root}", file=sys.stderr)
    parent = cluster_parent()
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rf-cluster-", dir=parent))
    return Cluster(root=root, bin_dir=bin_dir, keep=keep, coredns_bin=tools["coredns"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.up",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="start, wait for the node to be Ready, tear down and exit",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the cluster directory (logs) after tear-down"
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        help="a local Podman image to import into containerd (repeatable)",
    )
    parser.add_argument(
        "--knative",
        action="store_true",
        help="also install Knative Eventing and Serving (tests/cluster/knative.py)",
    )
    parser.add_argument(
        "--network-policies",
        action="store_true",
        help="also enforce NetworkPolicies (tests/cluster/network_policies.py)",
    )
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="only tear down clusters left behind by dead owners, and exit",
    )
    args = parser.parse_args(argv)
    if args.cleanup:
        for root in cleanup_stale():
            print(f"tore down {root}")
        return 0
    cluster = new_cluster(keep=args.keep)

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        cluster.start(tuple(args.image))
        if args.knative:
            from tests.cluster.knative import install_knative

            knative = install_knative(cluster, build_knative())
            print(f"broker ingress: {knative.broker_ingress}", flush=True)
        if args.network_policies:
            from tests.cluster.network_policies import enforce_network_policies

            enforce_network_policies(cluster)
        print(
            f"cluster directory: {cluster.root}\n"
            f"export KUBECONFIG={cluster.admin_kubeconfig}\n"
            f"pods reach this machine at {GATEWAY}",
            flush=True,
        )
        if not args.check:
            print("Ctrl-C (or SIGTERM) tears it down.", flush=True)
            while all(p.alive() for p in cluster.procs):
                time.sleep(1)
            for p in cluster.procs:
                if not p.alive():
                    print(f"{p.name} exited with {p.returncode}:\n{_tail(p.log)}", file=sys.stderr)
            return 1
        print(cluster.kubectl("get", "nodes", "-o", "wide"), end="")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
