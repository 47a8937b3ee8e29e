"""The name files stage and collect resolve with (``functions.runtimes.kube.name_files``): rendered
from the function's own, resolver data only, and pinned only when the function runs in the
cluster its tasks run in."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.errors import ConfigError
from functions.runtimes.kube import name_files
from functions.runtimes.kube.name_files import NameFiles, render, render_hosts, render_resolv_conf

# What the kubelet writes for a Knative function's pod (one hostAliases entry added).
KUBELET_HOSTS = """\
# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::1\tip6-allnodes
10.244.0.17\tcheck-00002-deployment-7d9f8c-x2k4p

# Entries added by HostAliases.
10.0.0.5\tstore.internal s3.internal
"""
POD_RESOLV_CONF = """\
search resource-functions.svc.cluster.local svc.cluster.local cluster.local
nameserver 10.96.0.10
options ndots:5
"""
OWN = "check-00002-deployment-7d9f8c-x2k4p"


def entries(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_hosts_keep_every_entry_but_the_functions_own_pod() -> None:
    assert entries(render_hosts(KUBELET_HOSTS, OWN)) == [
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        "fe00::0 ip6-localnet",
        "fe00::1 ip6-allnodes",
        "10.0.0.5 store.internal s3.internal",
    ]


def test_resolv_conf_keeps_the_resolver_lines() -> None:
    assert entries(render_resolv_conf(POD_RESOLV_CONF)) == POD_RESOLV_CONF.splitlines()


def test_only_resolver_data_is_kept() -> None:
    hosts = (
        "10.0.0.5 store # the store\n"
        "not-an-address name\n"
        "10.0.0.6 ok bad/name $(reboot) ok2\n"
        "10.0.0.7\n"
        "password=hunter2\n"
        "   \n"
    )
    assert entries(render_hosts(hosts)) == ["10.0.0.5 store", "10.0.0.6 ok ok2"]
    resolv = (
        "; a comment\n"
        "nameserver 10.96.0.10 # DNS\n"
        "nameserver dns.example\n"
        "nameserver 10.0.0.1 10.0.0.2\n"
        "search a.local b/c b.local\n"
        "options ndots:5 timeout:1 rotate $(x)\n"
        "sortlist 10.0.0.0/8\n"
        "token hunter2\n"
    )
    rendered = render_resolv_conf(resolv)
    assert entries(rendered) == [
        "nameserver 10.96.0.10",
        "search a.local b.local",
        "options ndots:5 timeout:1 rotate",
    ]
    assert "hunter2" not in rendered + render_hosts(hosts)


def test_a_resolv_conf_without_a_name_server_or_too_large_is_refused() -> None:
    with pytest.raises(ConfigError, match="TASK_NAME_FILES"):
        render(KUBELET_HOSTS, "search cluster.local\n", OWN)
    huge = "".join(f"10.0.{i // 250}.{i % 250} host-{i}.example\n" for i in range(5000))
    with pytest.raises(ConfigError, match="TASK_NAME_FILES=off"):
        render(huge, POD_RESOLV_CONF, OWN)


def test_read_own_renders_the_files_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text(KUBELET_HOSTS)
    (tmp_path / "resolv.conf").write_text(POD_RESOLV_CONF)
    got = name_files.read_own(tmp_path / "hosts", tmp_path / "resolv.conf")
    assert isinstance(got, NameFiles)
    assert "10.0.0.5 store.internal s3.internal" in got.hosts
    assert "nameserver 10.96.0.10" in got.resolv_conf
    with pytest.raises(ConfigError, match="cannot read"):
        name_files.read_own(tmp_path / "nope", tmp_path / "resolv.conf")


IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_auto_pins_them_only_inside_the_cluster(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert not name_files.wanted("auto", IN_POD, token)  # no token: not a pod
    token.write_text("t")
    assert name_files.wanted("auto", IN_POD, token)
    assert not name_files.wanted("off", IN_POD, token)
    assert not name_files.wanted("auto", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, token)
    assert not name_files.wanted("auto", {}, token)  # a host process with a kubeconfig


def test_outside_a_pod_nothing_is_pinned() -> None:
    assert name_files.from_settings("auto", {}) is None
    assert name_files.from_settings("off", IN_POD) is None
