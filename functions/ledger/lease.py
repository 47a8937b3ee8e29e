"""A lease per resource in the store (``leases/<resource-key>.json``): who runs its check now.

The record names the run that holds it, a nonce of this holding and an expiry::

    {"run": "<run-id>", "holder": "<random hex>", "expires": 1767225630.0, "released": false}

A lease is *free* when it is missing, released or expired. Taking a free lease is one
conditional write: create-only when missing, else replace-if-unchanged with the token of the
free state read, so of any number of replicas that saw it free exactly one wins. The holder
renews it (same compare-and-swap on its own token) while its check runs and releases it when
done by writing a released lease, so waiters see the end at their next read. An
asynchronous check's task cannot renew (nobody runs beside it): its lease lasts the task's
whole deadline, and the task releases it by its nonce (``release_holding``) once it has
recorded its outcome.

Tokens may name bytes (S3 ETag, file sha256): the holder nonce keeps every holding's bytes
distinct, so a stale token can never match a later holding. A write the client library
retried may take effect yet report ``PreconditionFailed``; each step re-reads and
recognises its own nonce before it concludes that it lost.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from functions.logs import fields
from functions.model import LeaseHold
from functions.periodic import Periodic
from storage import Store
from storage.store_errors import PreconditionFailed, StorageError

log = logging.getLogger("functions.ledger.lease")


@dataclass(frozen=True)
class Lease:
    run: str  # the run id of the check the holder runs: waiters wait for its result
    holder: str  # a nonce naming this holding
    expires: float  # epoch seconds
    released: bool = False

    def free(self, now: float) -> bool:
        return self.released or now >= self.expires


@dataclass(frozen=True)
class Claim:
    """A lease as read (or written) with the token of that state."""

    lease: Lease
    token: str


def parse(data: bytes) -> Lease:
    """The lease in a record's bytes; unreadable bytes are a free lease (taken over at once)."""
    try:
        value = json.loads(data)
        return Lease(
            run=str(value["run"]),
            holder=str(value["holder"]),
            expires=float(value["expires"]),
            released=bool(value.get("released", False)),
        )
    except (ValueError, TypeError, KeyError):
        return Lease(run="", holder="", expires=0.0)


def dump(lease: Lease) -> bytes:
    body = {
        "run": lease.run,
        "holder": lease.holder,
        "expires": lease.expires,
        "released": lease.released,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def read(store: Store, key: str) -> Claim | None:
    record = store.read_record(key)
    return None if record is None else Claim(parse(record.data), record.token)


def take(
    store: Store, key: str, seen: Claim | None, *, run: str, ttl: float, now: float
) -> Claim | None:
    """Take the lease that was ``seen`` free (``None``: missing) for ``run``; the new claim,
    or ``None`` if another replica changed it first."""
    mine = Lease(run=run, holder=secrets.token_hex(8), expires=now + ttl)
    return _write(store, key, mine, None if seen is None else seen.token)


def renew(store: Store, key: str, held: Claim, *, ttl: float, now: float) -> Claim | None:
    """Push the expiry of a lease still held; ``None`` if it was taken over meanwhile."""
    return _write(store, key, replace(held.lease, expires=now + ttl), held.token)


def release(store: Store, key: str, held: Claim) -> None:
    """Mark the lease released (a no-op if it was taken over meanwhile)."""
    _write(store, key, replace(held.lease, released=True), held.token)


def release_holding(store: Store, key: str, holder: str) -> bool:
    """Release the lease if the holding named by the nonce ``holder`` still has it: an
    asynchronous check's task knows its holding's nonce, not the token of the lease's current
    state. A no-op (False) once released or taken over."""
    current = read(store, key)
    if current is None or current.lease.holder != holder or current.lease.released:
        return False
    return _write(store, key, replace(current.lease, released=True), current.token) is not None


def _write(store: Store, key: str, lease: Lease, token: str | None) -> Claim | None:
    try:
        return Claim(lease, store.write_record(key, dump(lease), token))
    except PreconditionFailed:
        # Maybe our own write, retried by the client library: then the record holds our bytes.
        current = read(store, key)
        return current if current is not None and current.lease == lease else None


@contextmanager
def kept(store: Store, key: str, held: Claim, *, ttl: float) -> Iterator[None]:
    """Renew the lease every third of ``ttl`` while the block runs, release it after."""
    latest = [held]

    def renewing() -> bool:
        try:
            renewed = renew(store, key, latest[0], ttl=ttl, now=time.time())
        except StorageError as err:  # the next renewal may get through
            log.warning("lease renewal failed", extra=fields(key=key, error=str(err)))
            return True
        if renewed is None:
            log.warning("lease taken over while its check ran", extra=fields(key=key))
            return False
        latest[0] = renewed
        return True

    renewals = Periodic("lease-renewal", ttl / 3, renewing).start()
    try:
        yield
    finally:
        renewals.stop()
        try:
            release(store, key, latest[0])
        except StorageError as err:  # waiters fall back on the expiry
            log.warning("lease release failed", extra=fields(key=key, error=str(err)))


def release_held(store: Store, held: LeaseHold | None) -> None:
    """Release an asynchronous check's lease once its task has recorded its outcome (and the
    history), or has ended without one: waiters then answer from the result, or one of them
    runs the check. THE one place a task lets go of its lease, whichever runtime ran it (in
    a task pod ``collect``; the runtimes for failures collect never saw). Best effort: a
    failure is logged, never the task's; the lease's expiry frees it then."""
    if held is None:
        return
    try:
        release_holding(store, held.key, held.holder)
    except StorageError as err:
        log.warning("cannot release the check lease", extra=fields(key=held.key, error=str(err)))
