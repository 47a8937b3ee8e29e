"""When a Resource is due, as pure functions of its uid, interval and the time.

Time is cut into slots of the resource's interval, shifted by an offset of its own (a hash of
its uid: the same on every replica and after every restart), so a thousand resources of one
interval are spread over it, never all at once on the minute. A slot is checked once: its
claim (the slot's start and request id) is written into the status before the post, and the
request id is a function of the uid and the slot's start, so a second claim of one slot, by a
new leader or after a restart, posts the same request, which the functions run at most once.
"""

from __future__ import annotations

import hashlib
import uuid

REQUESTS = uuid.UUID("6a1d7a0e-3c39-5b8e-9a55-7e3c0f0c2b11")  # the namespace of request ids


def offset_of(uid: str, interval: int) -> int:
    """The resource's place in each of its slots, in whole seconds (0 ≤ offset < interval)."""
    digest = hashlib.sha256(uid.encode()).digest()
    return int.from_bytes(digest[:8], "big") % interval


def slot_start(now: float, interval: int, offset: int) -> int:
    """The start (epoch seconds) of the slot ``now`` falls in."""
    return (int(now) - offset) // interval * interval + offset


def request_id(uid: str, slot: int) -> str:
    """The check request of the resource's slot starting at ``slot``: the same for every
    claim of that slot."""
    return str(uuid.uuid5(REQUESTS, f"{uid}/{slot}"))
