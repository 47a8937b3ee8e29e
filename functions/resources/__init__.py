"""Resources as Kubernetes objects (docs/resources.md): a ``Resource`` (the project's API
group, namespaced) declares a type or image, a source and how often to check it; one scheduler
in the controller's Deployment posts each due check, spread over its interval, and writes what
the reply says into the object's status.

- ``schedule``: when a resource is due (its slots, a per-resource offset) and its request id
  for a slot (pure);
- ``decisions``: what one look at a Resource, or one reply to its check, leads to: a claim in its
  status, a post, the status a reply makes (pure);
- ``scheduler``: the shell: LIST and WATCH, a work queue of keys with their wake times, posts
  at a bounded rate, status writes guarded by the resourceVersion, Events.
"""
