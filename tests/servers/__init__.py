"""Real servers for tests and benchmarks, usable without pytest (see ``versitygw``)."""
