"""Kubernetes access, below every user of it (the runtimes, the credential provider, sender
authentication, the Tekton controller and artifacts service): the only package that imports
``kubernetes``.

- ``api``: the core objects as plain dicts in one namespace (Jobs, Pods, Secrets and their
  watches; Namespaces, TokenReviews), with errors translated (``KubeApi``, ``translate``).
- ``custom_objects``: a custom resource's objects as a controller uses them (paged LIST,
  watch, get, status writes, Events), each call counted, errors translated as ``api`` does.
- ``tekton_api``: the Tekton controller's CustomRuns (``custom_objects``) and its Lease.
- ``objects``: objects decoded one at a time from a LIST page or a watch line, within bounds.
"""
