"""Streaming tar archives of directories (zstd, gzip or plain), packed and unpacked safely.

options   formats, key suffixes, ArchiveOptions, Limits (imports no other module here)
safety    checks on names, links, kinds and sizes of entries (hostile input assumed)
xattrs    which extended attributes are kept, and how they travel in PAX records
pipe      a background producer thread feeding a pipe, read as a stream
readahead a stream read ahead of its reader by a thread, bounded
pack      a directory as a tar stream, reading nothing through a link
adaptive  ARCHIVE_LEVEL=auto: zstd's level from the compressor's waits on the pipe
extract   writing checked entries below a directory, never through a link
stream    pack() and unpack(): compression, digests, the two ends put together
"""

from storage.archive.options import FORMATS, ArchiveOptions, Limits, format_for_key, suffix_for
from storage.archive.stream import UnpackStats, pack, unpack

__all__ = [
    "FORMATS",
    "ArchiveOptions",
    "Limits",
    "UnpackStats",
    "format_for_key",
    "pack",
    "suffix_for",
    "unpack",
]
