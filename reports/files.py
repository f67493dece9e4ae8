"""Reading files the way kolo's C++ reader does (ReadFileBounded, engine/common/file.h): every file
the Python tools read, user-named or produced by a run, goes through read_bytes or read_text here.

A path is looked at before it is opened, so that a device such as /dev/zero is never opened, and
refused, naming what it is, unless it is a regular file of at most the limit: a FIFO (which would
block for ever), a device (which may never end), a directory, a socket. It is then opened without
blocking (a FIFO put in its place meanwhile opens at once, and is refused on the descriptor), and
at most limit + 1 bytes are read, so that a file that grows past the limit while it is read is
refused too. Errors name the file, what it is and what is allowed, as the C++ reader's do.

Standard library only, so that scripts/timeline-merge and the like run under any python3.
"""

from __future__ import annotations

import os
import stat

MiB = 1 << 20
# Sweep files, baselines, hostfiles, notes: hand-written, kilobytes.
CONFIG_LIMIT = 16 * MiB
# Results CSVs, run records, kolo-allreduce-bench JSON, a point's log: a sweep of thousands of
# points is a few MiB of CSV; a record, kilobytes to a few MiB.
RECORD_LIMIT = 256 * MiB
# kolo-train --timeline files: events per tensor per step, about 100 bytes each, so a long run of
# a large model reaches hundreds of MiB.
TIMELINE_LIMIT = 1024 * MiB
# Files of /proc (process status, environment, host counters): their size says 0, they hold KiB.
PROC_LIMIT = 16 * MiB

_CHUNK = 4 * MiB


class FileRefused(OSError):
    """A file that is not read: not a regular file, larger than its limit, or (NotUtf8) not text.
    An OSError, as a file that cannot be opened is, so that the handlers of unreadable files
    catch it; str() is the whole message, naming the file."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return self.args[0]


class NotUtf8(FileRefused):
    """A text file whose bytes are not UTF-8; `byte` and `offset` are the first bad byte's."""

    def __init__(self, path: str, message: str, byte: int, offset: int):
        super().__init__(path, message)
        self.byte = byte
        self.offset = offset


def _kind(mode: int) -> str:
    """What a path that is not a regular file is ("a FIFO", "a directory", ...), for errors."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "of an unknown kind"


def _check(st: os.stat_result, path: str, what: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(
            path,
            f"{what} '{path}' is {_kind(st.st_mode)}, not a regular file: kolo reads only regular "
            f"files (of at most {limit} bytes)",
        )
    if st.st_size > limit:
        raise FileRefused(path, f"{what} '{path}' is {st.st_size} bytes, more than the {limit} allowed")


def _read(path, what: str, limit: int) -> bytearray:
    path = os.fspath(path)
    if not path:
        raise FileRefused(path, f"{what}: the path is empty; name a file to read")
    # Looked at before it is opened, so that a device is never opened at all (opening some has
    # effects of its own); checked again on the descriptor, in case the path changed between.
    _check(os.stat(path), path, what, limit)
    # O_NONBLOCK: a FIFO opens at once, with or without a writer, instead of waiting for one (and
    # is then refused); O_NOCTTY: a terminal named by mistake does not become ours.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        _check(os.fstat(fd), path, what, limit)
        data = bytearray()
        # Bounded even if the file grows while it is read, and for files whose size says nothing
        # (those of /proc say 0).
        while len(data) <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(path, f"{what} '{path}' grew past the {limit} bytes allowed while it was read")
    return data


def read_bytes(path, what: str, limit: int) -> bytes:
    """The whole of `path`, a regular file of at most `limit` bytes. `what` names the file in
    errors ("sweep file", "baseline"). Raises FileRefused for anything else (a FIFO, a device, a
    directory, a larger file), and the OSError of a file that cannot be opened (FileNotFoundError,
    PermissionError)."""
    return bytes(_read(path, what, limit))


def read_text(path, what: str, limit: int) -> str:
    """read_bytes decoded as UTF-8; NotUtf8 (a FileRefused) names the first bad byte's offset."""
    path = os.fspath(path)
    return decode(_read(path, what, limit), path, what)


def decode(data: bytes | bytearray, path: str, what: str) -> str:
    """`data`, the bytes of file `path`, as UTF-8 text; NotUtf8 naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        byte = data[e.start]
        raise NotUtf8(
            path,
            f"{what} '{path}' is not valid UTF-8 (byte 0x{byte:02x} at offset {e.start}): kolo "
            "reads text files as UTF-8",
            byte,
            e.start,
        ) from None
