"""The labels and annotations the runtimes put on what they start, each spelled once: local
containers, task Jobs (their pods and stdin Secrets), warm check containers and warm pods.

Local containers carry short names (``run-id``, ``warm-check``: what ``podman ps --filter
label=…`` is given); Kubernetes objects carry the project's prefix. No value is a secret, a
team name or a source: keys and digests are hashes (docs/warm-checks.md, ``functions.keys``).
"""

from __future__ import annotations

from functions.steps.pod_contract import MANAGED_BY

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"  # the selector of everything the runtimes start
NAME_LABEL = "app.kubernetes.io/name"
PREFIX = "resource-functions.dev/"

# A run's local container (named after the run, so found again after a crash).
RUN_LABEL = "run-id"  # the sweep of finished runs reads it
REQUEST_DIGEST_LABEL = "request-digest"  # keys.request_digest: checked on adopting it

# A task Job, its pods and its stdin Secret.
ACTION_LABEL = f"{PREFIX}action"
JOB_RUN_LABEL = f"{PREFIX}run-id"
REQUEST_LABEL = f"{PREFIX}request-key"  # keys.request_label of the request's (source, id)
REQUEST_DIGEST_ANNOTATION = f"{PREFIX}request"  # keys.request_digest: checked on attaching
REQUEST_SOURCE_ANNOTATION = f"{PREFIX}request-source"  # for operators

# A warm check container (Docker/Podman) or pod: its key (``warm.check.pool_key``) and the
# owner that keeps it (a container: this process's pid and start time; a pod: a hash of the
# replica's pod name).
WARM_KEY_LABEL = "warm-check"
WARM_OWNER_LABEL = "warm-owner"
WARM_POD_KEY_LABEL = f"{PREFIX}{WARM_KEY_LABEL}"
WARM_POD_OWNER_LABEL = f"{PREFIX}{WARM_OWNER_LABEL}"
