"""Warm checks (docs/warm-checks.md): a warm container (a pod on Kubernetes) per team, image
and container settings serves the checks of many sources, each in a directory of its own.

- ``pool``: which container serves a check, and how long it lives (engine-free);
- ``check``: the one warm path of both runtimes (keys, the check in a container, its outcome);
- ``lifecycle``: what a runtime's set of warm containers shares (sweep, reaper, drain);
- ``engine``: Docker or Podman (an exec per check, through ``rf-agent run``);
- ``pods``, ``pod_manifest``, ``agent``: Kubernetes (a pod running ``rf-agent serve``, each check
  over the pod network).
"""
