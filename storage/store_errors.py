"""Errors raised by the storage layer.

    StorageError                 base of everything below
    ├── ObjectNotFound           the key does not exist (permanent)
    ├── ObjectExists             write-once refused: the key already exists (permanent)
    ├── PreconditionFailed       a record's conditional write refused: it exists (create) or
    │                            changed or vanished since it was read (replace); re-read, redo
    ├── StoreUnavailable         endpoint, bucket or credentials trouble; retryable by the caller
    ├── InvalidStoreURL          STORE_URL is malformed or names an unknown scheme (configuration)
    ├── InvalidKey               an object key breaks the key rules (a caller bug)
    └── ArchiveError             an artifact stream is unsafe or corrupt (permanent)
        ├── ArchiveRejected      hostile or over-limit content (the message names the entry)
        └── DigestMismatch       the bytes read do not have the expected sha256

Backends translate their client library's exceptions into these with ``raise … from``,
so callers never import botocore or google.api_core to handle a failure.

``retryable_status`` is the one table of HTTP answers worth trying again, used for every
dependency the services answer to (the store, the Kubernetes API, the sink): at the bottom of
the layers so that each translates its client's errors with the same rule.
"""

from __future__ import annotations

# No answer at all (0); the platform's own credentials refused (401, 403: a deployment to
# fix while the request waits for its redelivery, never a reason to fail it for good); a
# timeout (408); a conflict of the moment (409, as Knative retries it; the callers that mean
# "exists" handle it first); too early or too many (425, 429); server trouble (5xx).
_RETRYABLE_STATUSES = frozenset({0, 401, 403, 408, 409, 425, 429})


def retryable_status(status: int) -> bool:
    """Whether an HTTP answer with ``status`` from one of the platform's dependencies may
    succeed when the same request is sent again later."""
    return status in _RETRYABLE_STATUSES or status >= 500


class StorageError(Exception):
    """Base of all storage errors."""

    retryable = False


class ObjectNotFound(StorageError):
    """The object does not exist."""


class ObjectExists(StorageError):
    """The object already exists and objects are written once."""


class PreconditionFailed(StorageError):
    """A conditional record write was refused: the record was not as the caller read it.

    Creating (no token): a record or object already exists under the key. Replacing (a
    token): the record changed or was deleted since ``read_record`` returned that token.
    Not retryable as is: the caller reads the record again and redoes its change.
    """


class StoreUnavailable(StorageError):
    """The store could not be reached or refused access; trying again later may work."""

    retryable = True


class InvalidStoreURL(StorageError, ValueError):
    """The store URL cannot be used."""


class InvalidKey(StorageError, ValueError):
    """The object key cannot be used (the message says which rule it breaks)."""


class ArchiveError(StorageError):
    """An artifact stream could not be packed or unpacked safely."""


class ArchiveRejected(ArchiveError):
    """The archive holds an entry that is unsafe or over a limit."""


class DigestMismatch(ArchiveError):
    """The stream's sha256 differs from the expected digest."""
