"""The test cluster's fixed names and addresses, and where this machine keeps what it uses.

Pods live on the CNI bridge ``BRIDGE`` with the private subnet ``POD_SUBNET``; the bridge's
host-side address ``GATEWAY`` is the node IP and an address of this machine, where pods reach
the apiserver, the cluster DNS and the tests' servers. The first three may be moved with
``RF_CLUSTER_BRIDGE``, ``RF_CLUSTER_POD_SUBNET`` and ``RF_CLUSTER_GATEWAY``.
"""

from __future__ import annotations

import os
from pathlib import Path

NODE_NAME = "rf-node"
BRIDGE = os.environ.get("RF_CLUSTER_BRIDGE", "rfcni0")
POD_SUBNET = os.environ.get("RF_CLUSTER_POD_SUBNET", "10.244.0.0/24")
GATEWAY = os.environ.get("RF_CLUSTER_GATEWAY", "10.244.0.1")
SERVICE_RANGE = "10.96.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
SERVICE_IP = "10.96.0.1"
CNI_BIN = Path(os.environ.get("RF_CLUSTER_CNI_BIN", "/usr/lib/cni"))
# containerd 1.6 keeps runc's state and the shims' sockets here, whatever its own state dir.
RUN_DIR = Path("/run/containerd")
