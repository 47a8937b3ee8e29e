"""Real servers and stand-ins that the tests and the benchmarks both use: versitygw (S3),
Prometheus, a registry that is down or refusing on demand, an event sink, a runtime whose
"script" lists an in-memory repository, a single-node Kubernetes (``kubernetes/``). Not part of
the installed package; nothing here imports the tests."""
