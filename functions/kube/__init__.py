"""Kubernetes access, below every user of it (the runtimes, the credential provider, sender
authentication, the Tekton controller and artifacts service): the only package that imports
``kubernetes``.

- ``api``: the core objects as plain dicts in one namespace (Jobs, Pods, Secrets and their
  watches; Namespaces, TokenReviews), with errors translated (``KubeApi``, ``translate``).
- ``tekton_api``: the Tekton controller's calls (CustomRuns and their watch, Events, Leases),
  each counted, errors translated as ``api`` does.
"""
