"""Errors of the functions layer, and how each maps to an HTTP reply.

    FunctionError
    ├── InvalidRequest    the event or its data is wrong: HTTP 400, nothing started, never retried
    ├── Unavailable       infrastructure trouble (store, engine or cluster unreachable): HTTP 503,
    │                     so Knative redelivers
    └── ConfigError       the service's own configuration is wrong: refuse to start

A resource that runs and fails is *not* an error: it is an ``Outcome`` with a failure kind,
answered with HTTP 200 and a ``…failed`` event (see ``functions.outcome``).
"""
from __future__ import annotations


class FunctionError(Exception):
    """Base of the functions' own errors."""


class InvalidRequest(FunctionError):
    """The request cannot be served as sent. ``problems`` lists each thing that is wrong."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class Unavailable(FunctionError):
    """A dependency is unreachable or failing; the same request may succeed later."""


class ConfigError(FunctionError, ValueError):
    """A setting is missing or malformed; the message names the variable."""
