"""Native handles freed deterministically: close(), ``with``, or garbage collection.

A handle counts the native calls in flight so that close() from one thread never frees memory
that a call in another thread (running without the GIL) still uses.

close() first marks the handle closed, so every later use() raises the "closed" error at once
(there is no wait to enter: use() never blocks except on the short internal lock), then waits
for the calls already in flight in other threads, then frees. Calls are never let in while
close() waits, so it returns even while other threads keep calling (the library serialises
forwards, so with new calls let in, some call would always be in flight).

A thread that closes the handle while it is itself inside use() (a signal handler, a callback)
does not wait for its own calls: close() returns at once and the outermost of its calls frees
the memory when it ends. The lock is reentrant for the same reason.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Iterator, Optional

from .errors import InvalidArgumentError


class Handle:
    __slots__ = ("_ptr", "_free", "_what", "_cv", "_closed", "_users")

    def __init__(self, ptr: int, free: Optional[Callable[[int], None]], what: str):
        self._ptr: Optional[int] = ptr  # None once freed
        self._free = free  # None: borrowed, owned by another object
        self._what = what
        self._cv = threading.Condition(threading.RLock())
        self._closed = False
        # calls in flight per thread (thread id -> count); each change is one store, so a
        # signal handler running close() on the same thread never sees a half-made update
        self._users: Dict[int, int] = {}

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """The pointer, kept alive until the block ends. Raises the "closed" error once close()
        has begun."""
        me = threading.get_ident()
        with self._cv:
            if self._closed or self._ptr is None:
                raise InvalidArgumentError("%s is closed" % self._what)
            self._users[me] = self._users.get(me, 0) + 1
            ptr = self._ptr
        try:
            yield ptr
        finally:
            with self._cv:
                n = self._users.get(me, 1) - 1
                if n:
                    self._users[me] = n
                else:
                    self._users.pop(me, None)
                    if self._closed:
                        if not self._users:
                            self._free_locked()  # a close() deferred to the last call
                        self._cv.notify_all()

    def _others_in_flight(self, me: int) -> bool:
        return any(tid != me for tid in self._users)

    def _free_locked(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None and self._free is not None:
            self._free(ptr)

    def close(self) -> None:
        """Stops new calls now, waits for the calls in flight in other threads, then frees.
        Closing twice, from several threads at once, or from inside a call is fine."""
        me = threading.get_ident()
        with self._cv:
            self._closed = True
            while self._others_in_flight(me):
                self._cv.wait()
            if me not in self._users:
                self._free_locked()
            # else: this thread is inside a call; its last call frees on the way out

    def close_unlocked(self) -> None:
        """For __del__: nothing else can reference the object, so no call is in flight and no
        other thread holds the lock (taking it could deadlock when the collector runs inside a
        thread's critical section)."""
        self._closed = True
        if not self._users:
            self._free_locked()
