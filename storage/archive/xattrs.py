"""Extended attributes in artifacts: which are kept, and how they travel.

Kept: ``security.capability`` (file capabilities, e.g. ``ping``'s ``cap_net_raw``: images
depend on them) and ``user.*`` (the namespace for users' own data). Dropped, on packing and
on unpacking (a hostile archive cannot set them either):

- ``security.selinux`` and the other security modules' labels: the host's policy sets them;
  copied to another machine they mean nothing or the wrong thing;
- ``trusted.*``: readable and writable only with CAP_SYS_ADMIN, meant for the host itself;
- ``system.posix_acl_*`` (POSIX ACLs): not carried; the mode bits are.

They travel as ``SCHILY.xattr.<name>`` PAX records, the keyword GNU tar, bsdtar and Go's
``archive/tar`` (container image layers) read and write; the value is the attribute's raw
bytes. Restoring is best effort where the system says no (not root, for a capability; a
filesystem without user attributes): then the attribute is dropped, as ``tar --xattrs`` does.
A value the kernel calls invalid is the archive's fault: the entry is refused.
"""

from __future__ import annotations

import errno
import os
import tarfile

PAX_PREFIX = "SCHILY.xattr."
MAX_VALUE_BYTES = 65536  # XATTR_SIZE_MAX: Linux holds no bigger value
_CAPABILITY = "security.capability"
# The system may refuse a kept attribute: not allowed here, or not on this filesystem.
_REFUSED_HERE = frozenset({errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP})


def is_kept(name: str) -> bool:
    """Whether the attribute ``name`` is packed and restored."""
    return name == _CAPABILITY or (name.startswith("user.") and len(name) > len("user."))


def pax_records(fd: int) -> dict[str, str]:
    """The PAX records of the kept attributes of the open file or directory ``fd``, sorted
    by name (deterministic bytes). Values are raw bytes as ``surrogateescape`` text, which
    ``tarfile`` writes back as the same bytes."""
    try:
        names = os.listxattr(fd)
    except OSError as err:
        if err.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        raise
    records: dict[str, str] = {}
    for name in sorted(n for n in names if is_kept(n)) if names else ():
        try:
            value = os.getxattr(fd, name)
        except OSError as err:
            if err.errno == errno.ENODATA:  # removed since it was listed
                continue
            raise
        records[PAX_PREFIX + name] = value.decode("utf-8", "surrogateescape")
    return records


def of_member(member: tarfile.TarInfo) -> list[tuple[str, bytes]]:
    """The kept attributes ``member`` carries, as (name, value); others are ignored."""
    attributes = []
    for key, text in sorted(member.pax_headers.items()):
        name = key[len(PAX_PREFIX) :]
        if key.startswith(PAX_PREFIX) and is_kept(name):
            attributes.append((name, text.encode("utf-8", "surrogateescape")))
    return attributes


def oversized(attributes: list[tuple[str, bytes]]) -> str | None:
    """The first attribute whose value no Linux filesystem can hold, if any."""
    return next((name for name, value in attributes if len(value) > MAX_VALUE_BYTES), None)


def restore(fd: int, attributes: list[tuple[str, bytes]]) -> None:
    """Set ``attributes`` on ``fd``; skip those the system refuses here (see module doc).
    Any other failure (``EINVAL``: a malformed capability, say) raises ``OSError`` whose
    ``strerror`` names the attribute."""
    for name, value in attributes:
        try:
            os.setxattr(fd, name, value)
        except OSError as err:
            if err.errno not in _REFUSED_HERE:
                reason = f"extended attribute {name!r}: {err.strerror}"
                raise OSError(err.errno, reason) from err
