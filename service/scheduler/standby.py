"""The standby's side of ownership: a tick of a job this replica stands by for is
claimed only if it still has no ledger row `TICKGATE_TAKEOVER_SECONDS` after it fell
due (its owner died, stalls, or never had it).

Held-back ticks are checked against the ledger together, in one read that takes no
lock, so a healthy owner costs its standby one index probe per tick and nothing more.
The check only saves work: a tick it lets through is still claimed at the gate, which
answers "already ran" if the owner's row came meanwhile.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from service.store.errors import is_unavailable
from service.store.ports import Ledger

log = logging.getLogger(__name__)

# A ledger read that takes longer lets its ticks through to the gate instead.
CHECK_SECONDS = 5.0


class HeldTick(Protocol):
    @property
    def job_name(self) -> str: ...

    @property
    def scheduled_for(self) -> datetime: ...


T = TypeVar("T", bound=HeldTick)


class Standby(Generic[T]):
    """Holds standby ticks back, then hands on those still without a row (`claim`) and
    settles the others (`settled`)."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        takeover_seconds: float,
        claim: Callable[[T], None],
        settled: Callable[[T], None],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._ledger = ledger
        self._takeover = takeover_seconds
        self._claim = claim
        self._settled = settled
        self._spawn = spawn
        self._ready: list[T] = []

    def hold(self, tick: T, due_in_seconds: float) -> None:
        """Check `tick` the takeover time after it falls due (in `due_in_seconds`)."""
        asyncio.get_running_loop().call_later(
            max(0.0, due_in_seconds) + self._takeover, self._ready_to_check, tick
        )

    def _ready_to_check(self, tick: T) -> None:
        # Ticks of one instant come due together: the first plans one check for all.
        if not self._ready:
            asyncio.get_running_loop().call_soon(self._check_ready)
        self._ready.append(tick)

    def _check_ready(self) -> None:
        ticks, self._ready = self._ready, []
        self._spawn(self._check(ticks))

    async def _check(self, ticks: Sequence[T]) -> None:
        keys = [(tick.job_name, tick.scheduled_for) for tick in ticks]
        try:
            async with asyncio.timeout(CHECK_SECONDS):
                unrun = await self._ledger.ticks_without_runs(keys)
        except Exception as error:  # noqa: BLE001 - the gate decides instead
            level = logging.WARNING if is_unavailable(error) else logging.ERROR
            log.log(
                level, "standby check of %d ticks failed (%r); claiming them", len(ticks), error
            )
            unrun = set(keys)
        for tick, key in zip(ticks, keys, strict=True):
            (self._claim if key in unrun else self._settled)(tick)
