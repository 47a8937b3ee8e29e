"""``python -m testbed.kubernetes``: a cluster by hand (see the package's docstring)."""

from __future__ import annotations

import argparse
import signal
import sys
import time

import testbed.kubernetes
from testbed.kubernetes.builds import build_knative
from testbed.kubernetes.directories import cleanup_stale, new_cluster
from testbed.kubernetes.knative import install_knative
from testbed.kubernetes.layout import GATEWAY
from testbed.kubernetes.network_policies import enforce_network_policies
from testbed.kubernetes.processes import tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.kubernetes",
        description=testbed.kubernetes.__doc__,
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
        help="also install Knative Eventing and Serving (testbed/kubernetes/knative.py)",
    )
    parser.add_argument(
        "--network-policies",
        action="store_true",
        help="also enforce NetworkPolicies (testbed/kubernetes/network_policies.py)",
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
            knative = install_knative(cluster, build_knative())
            print(f"broker ingress: {knative.broker_ingress}", flush=True)
        if args.network_policies:
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
                    print(f"{p.name} exited with {p.returncode}:\n{tail(p.log)}", file=sys.stderr)
            return 1
        print(cluster.kubectl("get", "nodes", "-o", "wide"), end="")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
