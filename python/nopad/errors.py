"""Exceptions: one class per nopad_status, all derived from NopadError.

Every failing library call raises the subclass of its status, with nopad_last_error() as the
message (what, where, what was expected). Each subclass also derives from the closest Python
built-in, so ``except ValueError`` or ``except OSError`` catch what one would expect:

==========================  ====================  ===================================
status                      class                 also a
==========================  ====================  ===================================
NOPAD_ERR_INVALID_ARGUMENT  InvalidArgumentError  ValueError
NOPAD_ERR_IO                FileError             OSError
NOPAD_ERR_FORMAT            FormatError           ValueError
NOPAD_ERR_UNSUPPORTED       UnsupportedError      NotImplementedError
NOPAD_ERR_OUT_OF_MEMORY     OutOfMemoryError      MemoryError
NOPAD_ERR_BUFFER_TOO_SMALL  BufferTooSmallError   ValueError
NOPAD_ERR_TOO_LONG          TooLongError          ValueError
NOPAD_ERR_BACKEND           BackendError          RuntimeError
NOPAD_ERR_INTERNAL          InternalError         RuntimeError
NOPAD_ERR_QUEUE_FULL        QueueFullError        RuntimeError
==========================  ====================  ===================================

Checks made in Python before a call (shapes, dtypes, closed objects) raise the same classes.
"""
from __future__ import annotations

import enum
from typing import Dict, Optional, Type

__all__ = [
    "Status", "NopadError", "InvalidArgumentError", "FileError", "FormatError",
    "UnsupportedError", "OutOfMemoryError", "BufferTooSmallError", "TooLongError",
    "BackendError", "InternalError", "QueueFullError", "LibraryNotFoundError",
]


class Status(enum.IntEnum):
    """nopad_status codes (include/nopad.h)."""

    OK = 0
    INVALID_ARGUMENT = 1
    IO = 2
    FORMAT = 3
    UNSUPPORTED = 4
    OUT_OF_MEMORY = 5
    BUFFER_TOO_SMALL = 6
    TOO_LONG = 7
    BACKEND = 8
    INTERNAL = 9
    QUEUE_FULL = 10


class NopadError(Exception):
    """Base class of every nopad error.

    Attributes:
        status: the nopad_status of the failure (a :class:`Status`), or None for errors that do
            not come from a status (e.g. the library could not be found).
        message: the message, as ``str(error)``.
    """

    status: Optional[Status] = None

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(NopadError, ValueError):
    """A value is out of range or inconsistent (bad id, bad cu_seqlens, invalid UTF-8, ...)."""

    status = Status.INVALID_ARGUMENT


class FileError(NopadError, OSError):
    """A file or folder is missing or unreadable."""

    status = Status.IO


class FormatError(NopadError, ValueError):
    """A file is malformed (safetensors, JSON, vocab, ...)."""

    status = Status.FORMAT


class UnsupportedError(NopadError, NotImplementedError):
    """Well-formed but not supported (model_type, dtype, a device this build lacks, ...)."""

    status = Status.UNSUPPORTED


class OutOfMemoryError(NopadError, MemoryError):
    """An allocation failed."""

    status = Status.OUT_OF_MEMORY


class BufferTooSmallError(NopadError, ValueError):
    """An output buffer is too small."""

    status = Status.BUFFER_TOO_SMALL


class TooLongError(NopadError, ValueError):
    """A sequence exceeds the model's maximum length and truncation is off."""

    status = Status.TOO_LONG


class BackendError(NopadError, RuntimeError):
    """The compute backend failed (e.g. a CUDA error)."""

    status = Status.BACKEND


class InternalError(NopadError, RuntimeError):
    """A bug in nopad."""

    status = Status.INTERNAL


class QueueFullError(NopadError, RuntimeError):
    """An engine's queue of waiting requests is full; retry later (a server's HTTP 429)."""

    status = Status.QUEUE_FULL


class LibraryNotFoundError(NopadError, ImportError):
    """libnopad.so could not be found or loaded."""


_BY_STATUS: Dict[int, Type[NopadError]] = {
    cls.status: cls
    for cls in (InvalidArgumentError, FileError, FormatError, UnsupportedError, OutOfMemoryError,
                BufferTooSmallError, TooLongError, BackendError, InternalError, QueueFullError)
}


def error_for(status: int, message: str) -> NopadError:
    """The exception for a non-OK status code (unknown codes give a plain NopadError)."""
    cls = _BY_STATUS.get(int(status))
    if cls is None:
        err = NopadError("%s (status %d)" % (message, int(status)))
        return err
    # One argument only: OSError would read two as (errno, strerror).
    return cls(message)
