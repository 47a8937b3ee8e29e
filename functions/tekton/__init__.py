"""A Tekton Custom Task for check, get and put (``resource-functions tekton-controller``).

- ``params``: a CustomRun's params as request data (pure; bad params name the param).
- ``status``: the CustomRun status the controller writes (pure).
- ``decide``: what to do next with a CustomRun, given its object and the time (pure).
- ``reply``: a reply event as the next status (pure).
- ``controller``: the list/watch loop, the deadlines, the effects (post, stop, patch).
- ``receiver``: the HTTP endpoint the replies' Knative Trigger delivers to.
- ``config``: the controller's environment.

docs/tekton.md is the user's side of it.
"""
