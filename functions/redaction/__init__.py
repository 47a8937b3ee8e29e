"""Secrets out of everything a person reads: logs, log tails, failure messages, metadata.

``policy`` says which values are secrets and which of them can be redacted, ``forms`` in which
forms they can reappear, and ``Redactor`` (one automaton per run) takes them out of any
text, before any cut. docs/redaction.md describes the whole.
"""

from functions.redaction.policy import DEFAULT_REDACT_KEYS, MIN_CHARS, secret_values
from functions.redaction.redactor import REDACTED, Redactor

__all__ = ["DEFAULT_REDACT_KEYS", "MIN_CHARS", "REDACTED", "Redactor", "secret_values"]
