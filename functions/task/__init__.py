"""The task: what runs around a resource script, in a task pod or in-process (container
runtime). ``contract`` is the layout both runtimes and the in-pod steps agree on."""
