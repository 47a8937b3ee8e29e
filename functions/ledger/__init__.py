"""Where a run's traces are kept in the store: results, logs and cache records, the version history, the check lease and the run index."""
