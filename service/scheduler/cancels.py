"""Following the cancels asked of a replica's runs (POST /v1/runs/{id}/cancel).

The API that answers the cancel is seldom the process running the run: the request is
kept on the run's row, and each process running runs looks for the cancels asked of
them, but only while it has some in flight. It looks at once when told (a NOTIFY heard by
the scheduler's listener) and every LOOK_SECONDS anyway: a notification lost with its
connection, a run claimed just as it was cancelled, and a process that does not listen
(the API's, running manual runs) are all found there. A look is one probe of an index
that holds only the runs awaiting their cancel.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from service.domain.runs import CancelRequest
from service.store.ports import Ledger

log = logging.getLogger(__name__)

LOOK_SECONDS = 1.0


class Cancels:
    """Calls `stop(request)` for each cancel asked of `runner`'s runs, while `busy()`."""

    def __init__(
        self,
        ledger: Ledger,
        runner: str,
        stop: Callable[[CancelRequest], None],
        busy: Callable[[], bool],
    ) -> None:
        self._ledger = ledger
        self._runner = runner
        self._stop = stop
        self._busy = busy
        self._now = asyncio.Event()
        self._following: asyncio.Task[None] | None = None

    def asked(self) -> None:
        """A cancel was asked somewhere: look at once (if anything runs here)."""
        self._now.set()

    def follow(self) -> None:
        """A run started here: follow its cancels, unless that is under way already."""
        if self._following is None or self._following.done():
            self._following = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while self._busy():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOOK_SECONDS):
                    await self._now.wait()
            self._now.clear()
            await self._look()

    async def _look(self) -> None:
        try:
            requests = await self._ledger.cancels_asked(self._runner)
        except Exception as error:  # noqa: BLE001 - logged; the next look tries again
            log.warning("could not look for cancels (%r); looking again", error)
            return
        for request in requests:
            self._stop(request)

    async def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
