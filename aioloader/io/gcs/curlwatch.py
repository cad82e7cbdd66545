"""Watching the sockets libcurl asks for (its `M_SOCKETFUNCTION`), for `curl.CurlSession`.

libcurl asks to watch a connection's socket when a transfer starts on it and to stop
(POLL_REMOVE) when the transfer ends, so a kept-alive connection is watched and unwatched
once per request. On the event loop that costs a reader handle made and dropped each time
(a good part of a GET's CPU: benchmarks/request_cost.py). `EpollWatch` keeps one
epoll of its own, registered with the loop once, and leaves an idle connection's socket in
it: the next request on that connection costs one `epoll_ctl`.

What makes that safe: a socket libcurl closes leaves the epoll by itself (the kernel drops
a closed descriptor's registration), and nothing else is ever registered in this epoll, so
its number, when reused, is never mistaken for the old socket: reusing an idle number
starts with `modify`, which fails for a socket the epoll does not hold, and then it is
registered. An idle socket that becomes readable (the server closed it) is dropped from the
epoll at once, so it cannot keep the loop busy; libcurl finds it dead when it next tries it.

`LoopWatch` (no epoll: not Linux) watches each socket with the loop's own readers and
writers, unwatching it as soon as libcurl lets go of it (a closed descriptor must never stay
registered with the loop: its number is reused).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import Callable

import pycurl

__all__ = ["EpollWatch", "LoopWatch", "new_watch"]

Ready = Callable[[int, int], None]  # (fd, CSELECT_* flags): hand libcurl a ready socket


class LoopWatch:
    """Each socket watched by the event loop's own readers and writers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ready: Ready) -> None:
        self._loop = loop
        self._ready = ready
        self._watched: dict[int, int] = {}  # fd -> the POLL_* events the loop watches

    def set(self, fd: int, what: int) -> None:
        """Watch `fd` for `what` (POLL_IN/OUT/INOUT; POLL_REMOVE: not at all)."""
        loop, watched = self._loop, self._watched
        had = watched.get(fd, 0)
        want = 0 if what == pycurl.POLL_REMOVE else what
        if want == had:
            return
        if (had ^ want) & pycurl.POLL_IN:
            if want & pycurl.POLL_IN:
                loop.add_reader(fd, self._ready, fd, pycurl.CSELECT_IN)
            else:
                loop.remove_reader(fd)
        if (had ^ want) & pycurl.POLL_OUT:
            if want & pycurl.POLL_OUT:
                loop.add_writer(fd, self._ready, fd, pycurl.CSELECT_OUT)
            else:
                loop.remove_writer(fd)
        if want:
            watched[fd] = want
        else:
            del watched[fd]

    def close(self) -> None:
        for fd in self._watched:  # none should be left; never leave one registered
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self._watched.clear()


class EpollWatch:
    """The sockets in one epoll of our own, itself watched by the loop (Linux)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ready: Ready) -> None:
        self._loop = loop
        self._ready = ready
        self._epoll = select.epoll()
        self._active: dict[int, int] = {}  # fd -> POLL_* libcurl asked for, mid-transfer
        self._idle: set[int] = set()  # let go by libcurl, still in the epoll (for reading)
        loop.add_reader(self._epoll.fileno(), self._events)

    def set(self, fd: int, what: int) -> None:
        """Watch `fd` for `what` (POLL_IN/OUT/INOUT; POLL_REMOVE: libcurl let go of it)."""
        ep, active = self._epoll, self._active
        if what == pycurl.POLL_REMOVE:
            had = active.pop(fd, None)
            if had == pycurl.POLL_IN:  # kept, for reading only: the next request is cheap
                self._idle.add(fd)
            elif had is not None:  # (a writable socket would wake the loop at every turn)
                _unregister(ep, fd)
            return
        mask = ((select.EPOLLIN if what & pycurl.POLL_IN else 0)
                | (select.EPOLLOUT if what & pycurl.POLL_OUT else 0))
        had = active.get(fd)
        if had == what:
            return
        if had is not None:
            ep.modify(fd, mask)
        elif fd in self._idle:  # the same socket, unless libcurl closed it and the number
            self._idle.discard(fd)  # was reused: then it is not in the epoll, and modify
            try:  # says so
                ep.modify(fd, mask)
            except FileNotFoundError:
                ep.register(fd, mask)
        else:
            try:
                ep.register(fd, mask)
            except FileExistsError:  # still held through a copy (a fork): take it over
                ep.modify(fd, mask)
        active[fd] = what

    def _events(self) -> None:
        active, idle, ready = self._active, self._idle, self._ready
        for fd, ev in self._epoll.poll(0):
            if fd in active:
                ready(fd, (pycurl.CSELECT_IN if ev & _READABLE else 0)
                      | (pycurl.CSELECT_OUT if ev & select.EPOLLOUT else 0)
                      | (pycurl.CSELECT_ERR if ev & select.EPOLLERR else 0))
            else:  # idle (the server closed it, most likely), or gone: out of the epoll
                idle.discard(fd)
                _unregister(self._epoll, fd)

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._active.clear()
        self._idle.clear()


_READABLE = select.EPOLLIN | select.EPOLLHUP if hasattr(select, "EPOLLIN") else 0


def _unregister(ep: select.epoll, fd: int) -> None:
    with contextlib.suppress(OSError):  # closed already (and so out of the epoll)
        ep.unregister(fd)


def new_watch(loop: asyncio.AbstractEventLoop, ready: Ready) -> EpollWatch | LoopWatch:
    """An `EpollWatch` where the platform has epoll, else a `LoopWatch`."""
    return EpollWatch(loop, ready) if hasattr(select, "epoll") else LoopWatch(loop, ready)
