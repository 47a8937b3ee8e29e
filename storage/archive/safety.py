"""Rules that decide whether a tar entry may be extracted, shared by pack and unpack.

Everything here is pure: it looks at names, link targets, types, sizes and tar headers
and raises ``ArchiveRejected`` (naming the entry) or ``ArchiveError``; it never touches the
filesystem. ``archive_extract`` applies these rules while it writes.

Links are data. A symlink's target is stored and restored verbatim, whatever it says
(absolute, climbing out of the tree, dangling): image root filesystems are full of absolute
ones. So safety cannot come from vetting targets; it comes from extraction, which never
follows a link and never creates anything through one (see ``archive.extract``). Entry names
and hard-link targets, on the other hand, are paths the extractor writes to: those must be
relative, without ``..``, and hard links may only name files extracted earlier.
"""

from __future__ import annotations

import math
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from storage.store_errors import ArchiveError, ArchiveRejected

if TYPE_CHECKING:
    from storage.archive.options import Limits

MAX_PATH_BYTES = 4096  # PATH_MAX: longer names only serve to slow the extractor down
MAX_HEADER_BYTES = 1 << 20  # pax / GNU long-name headers are read into memory whole
_MAX_MTIME = 1 << 40  # far beyond any real clock; rejects NaN/inf/overflow tricks

_EXTENDED_HEADER_TYPES = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)
# tarfile's header errors (public names in tarfile, missing from typeshed)
_END_MARKER = tarfile.EOFHeaderError  # type: ignore[attr-defined]
_CUT_SHORT = (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError)  # type: ignore[attr-defined]
_REFUSED_KINDS = {
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


def rejected(name: str, reason: str) -> ArchiveRejected:
    """The error for entry ``name``; the message always starts with the entry's name."""
    return ArchiveRejected(f"entry {name!r}: {reason}")


def member_parts(name: str, *, entry: str | None = None) -> tuple[str, ...]:
    """Split an entry name into its components, or refuse it.

    ``.`` and empty components are dropped (``./a//b`` is ``a/b``); absolute names, ``..``
    components, NUL bytes and names over ``MAX_PATH_BYTES`` are refused. An empty result
    names the extraction directory itself. With ``entry``, ``name`` is that entry's hard
    link target and errors name the entry.
    """

    def refuse(reason: str) -> ArchiveRejected:
        if entry is None:
            return rejected(name, reason)
        return rejected(entry, f"hard link target {name!r}: {reason}")

    if "\0" in name:
        raise refuse("name contains a NUL byte")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise refuse(f"name longer than {MAX_PATH_BYTES} bytes")
    if name.startswith("/"):
        raise refuse("absolute path")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise refuse("path contains a '..' component")
    return parts


def check_symlink(name: str, target: str) -> None:
    """Refuse a symlink at ``name`` whose ``target`` no filesystem can hold: empty, with a
    NUL byte, or longer than ``MAX_PATH_BYTES``. Any other target is kept verbatim."""
    too_long = len(target.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES
    if not target or "\0" in target or too_long:
        raise rejected(name, f"invalid symlink target {target[:200]!r}")


def check_kind(member: tarfile.TarInfo) -> None:
    """Accept regular files, directories, symlinks and hard links; refuse everything else."""
    if member.type in _REFUSED_KINDS or member.sparse is not None:
        kind = _REFUSED_KINDS.get(member.type, "a sparse file")
        raise rejected(member.name, f"{kind} is not allowed")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise rejected(member.name, f"unsupported entry type {member.type!r}")
    if not (isinstance(member.mtime, int) or math.isfinite(member.mtime)):
        raise rejected(member.name, f"invalid mtime {member.mtime!r}")
    if abs(member.mtime) > _MAX_MTIME:
        raise rejected(member.name, f"invalid mtime {member.mtime!r}")


@dataclass
class Budget:
    """Running totals of one extraction, checked against ``Limits`` before each entry."""

    limits: Limits
    entries: int = 0
    bytes: int = 0

    def admit(self, member: tarfile.TarInfo) -> None:
        """Count ``member``; raise before anything is written if it breaks a limit."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise rejected(member.name, f"archive has more than {self.limits.max_entries} entries")
        if not member.isreg():
            return
        if member.size > self.limits.max_entry_bytes:
            raise rejected(
                member.name,
                f"{member.size} bytes is over the entry limit of {self.limits.max_entry_bytes}",
            )
        self.bytes += member.size
        if self.bytes > self.limits.max_total_bytes:
            raise rejected(
                member.name,
                f"archive total exceeds the limit of {self.limits.max_total_bytes} bytes",
            )


class StrictTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` for reading untrusted streams with ``tarfile.open(tarinfo=…)``.

    tarfile is lenient where we must not be: after the first member it treats a missing,
    truncated or invalid header as the end of the archive, so a truncated stream would
    extract "successfully"; and it reads pax / GNU long-name headers into memory whatever
    size they claim. Here the end-of-archive marker (a zero block) is required and extended
    headers are capped at ``MAX_HEADER_BYTES``.
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile_)
        except _END_MARKER:
            raise  # the end-of-archive marker: tarfile ends the archive here
        except _CUT_SHORT as err:
            raise ArchiveError(
                "truncated archive: the stream ends before the tar end marker"
            ) from err
        except tarfile.HeaderError as err:
            raise ArchiveError(f"corrupt archive: invalid tar header ({err})") from err

    # A private hook, kept on purpose: PEP 706's filter="data" judges a member only after its
    # headers were read (a pax header claiming gigabytes is in memory by then) and does not
    # make a truncated stream an error; no public hook sees an extended header's size first.
    # Pinned by test_huge_extended_header_is_refused_before_it_is_read.
    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED_HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise ArchiveRejected(
                f"extended tar header of {self.size} bytes (limit {MAX_HEADER_BYTES})"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]
