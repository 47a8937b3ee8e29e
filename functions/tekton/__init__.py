"""A Tekton Custom Task for check, get and put (``resource-functions tekton-controller``), and
the artifacts service its Tasks' steps reach the store through (``serve artifacts``).

- ``params``: a CustomRun's params as request data (pure; bad params name the param).
- ``status``: the CustomRun status the controller writes (pure).
- ``decide``: what to do next with a CustomRun, given its object and the time, and what a
  reply leads to (pure).
- ``namespace_teams``: which team a namespace serves (``TEKTON_TEAMS`` or its label).
- ``controller``: the reconciler's shell (the cache, the work queue's workers, posts, Events);
  ``work_queue``, ``leader`` (the Lease), ``tekton_api`` (its Kubernetes calls),
  ``controller_metrics``.
- ``receiver``: the HTTP endpoint the replies' Knative Trigger delivers to, and ``main``.
- ``controller_config``: the controller's environment.
- ``artifact_service``: the artifacts service.

docs/tekton.md is the user's side of it.
"""
