"""The plain (`for`) iteration of a `Loader`: the sync pump (`aioloader.io.sync.pump`) on
the background loop, handing out batches and their states in the consumer's thread.

Leaving a `for` loop early (break, return, an iterator dropped) closes the loader: the
batches the pump had ready go with it, so a later iteration cannot go on where the first
stopped. It is refused with an error saying so (`LEFT`), rather than ending at once as if
the data had run out. This module owns that fact (`Plain.left`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..io.sync import pump
from .lifecycle import Binding, forked_error
from .parts import SYNC_HANDOFF_DEPTH
from .position import Position

LEFT = ("this loader was closed when a `for` loop over it was left (break, return) or an "
        "iterator of it was dropped, and the batches it had ready went with it: to take "
        "batches a few at a time, keep one iterator (`batches = iter(loader)`, then "
        "`next(batches)`); to go on from the last batch handed out, start a new loader "
        "with state=loader.get_state()")


class Plain:
    """The plain iterations of one loader, and whether one was left before its end."""

    def __init__(self) -> None:
        self.left = False

    def iterate(self, binding: Binding, take: Callable[[], Awaitable[Any]],
                position: Position, closed: Callable[[], bool],
                close: Callable[[], None]) -> Iterator[Any]:
        """Batches from `take` until the end, each one's state handed out to `position`
        when the consumer takes it; `close` closes the loader when the iteration ends."""
        binding.check_process()
        loop = binding.background()
        pid = os.getpid()

        def check() -> None:
            if os.getpid() != pid:  # a forked child: the pump is the parent's
                raise forked_error(pid)

        if self.left:
            raise RuntimeError(LEFT)
        items = pump(loop, take, depth=SYNC_HANDOFF_DEPTH, closing=closed, check=check,
                     on_exit=close, held=True)
        ended = False
        try:
            for batch, state in items:
                position.hand_out(state)
                yield batch
            ended = True
        finally:  # left early (break, or the iterator dropped): `items` closes the loader next
            self.left = not ended and not closed()
