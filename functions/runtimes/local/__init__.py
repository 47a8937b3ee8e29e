"""The local runtime: each task in a container of a Docker or Podman engine (``container``),
its script's output attached and collected in-process, and the sweep of finished runs."""
