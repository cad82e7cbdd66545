"""The first read of a remote dataset goes alone, record by record, before any segment.

The time to the first batch should neither wait for whole segments (~4 MiB each) nor
compete with them for the link. So the first read on the tier's event loop is made
directly (`claim`), every other read waits for it (`gate`), and once it is done or has
failed (`start`) segments may come. Reads on another event loop are not served by the tier
(they read directly).
"""

from __future__ import annotations

import asyncio


class FirstRead:
    """The gate the first read holds until it is done."""

    def __init__(self) -> None:
        self.started = False  # segments are coming: from now on, reads wait for them
        self._direct = False  # the first read is being made directly
        self._loop: asyncio.AbstractEventLoop | None = None
        self._go: asyncio.Event | None = None  # set by `start`

    @property
    def unclaimed(self) -> bool:
        """No read has started yet: the next one is the first, made directly."""
        return not self.started and not self._direct

    def claim(self) -> bool:
        """True for the first read (on this event loop): make it directly, then `start`."""
        if self.unclaimed and self.bind():
            self._direct = True
            return True
        return False

    async def wait(self) -> bool:
        """Until the first read is done; False on another event loop."""
        if not self.bind():
            return False
        if not self.started:
            await self._go.wait()  # type: ignore[union-attr]
        return True

    def bind(self) -> bool:
        """Whether the running loop is the tier's (the first to ask binds it)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._go = loop, asyncio.Event()
        return self._loop is loop

    def start(self) -> bool:
        """The first read is done (or failed): True if this call opened the gate."""
        if self._loop is not asyncio.get_running_loop() or self.started:
            return False
        self.started = True
        self._go.set()  # type: ignore[union-attr]
        return True

    def wake(self) -> None:
        """Let those waiting go (the tier is closing: they see it)."""
        if self._go is not None:
            self._go.set()
