"""Native handles freed deterministically: close(), ``with``, or garbage collection.

A handle counts the native calls in flight so that close() from one thread never frees memory
that a call in another thread (running without the GIL) still uses: close() waits for them.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Optional

from .errors import InvalidArgumentError


class Handle:
    __slots__ = ("_ptr", "_free", "_what", "_cv", "_users")

    def __init__(self, ptr: int, free: Optional[Callable[[int], None]], what: str):
        self._ptr: Optional[int] = ptr
        self._free = free  # None: borrowed, owned by another object
        self._what = what
        self._cv = threading.Condition(threading.Lock())
        self._users = 0

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """The pointer, kept alive until the block ends."""
        with self._cv:
            if self._ptr is None:
                raise InvalidArgumentError("%s is closed" % self._what)
            self._users += 1
            ptr = self._ptr
        try:
            yield ptr
        finally:
            with self._cv:
                self._users -= 1
                if self._users == 0:
                    self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            while self._users:
                self._cv.wait()
            ptr, self._ptr = self._ptr, None
        if ptr is not None and self._free is not None:
            self._free(ptr)

    def close_unlocked(self) -> None:
        """For __del__: nothing else can reference the object, so no call is in flight."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None and self._free is not None:
            self._free(ptr)
