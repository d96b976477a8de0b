"""This replica's role for each job it mirrors, and handovers that leave no gap.

When the members change, every replica sees it within about a second of the others, and
loads what it now owns only after that. So a promotion (to owner, or a job newly ranked
here) applies at once, and a demotion (owner to standby, or out of the rank) only after
HANDOVER_SECONDS: until then this replica goes on firing the job as before, while its
new owner loads it. For a moment both may claim the same ticks; the gate lets one
through. A job that leaves the rank is dropped from the mirror once its handover ends.
"""

import asyncio
from collections.abc import Callable

from service.domain.ownership import Role

# Longer than every member takes to see a change of members and load what it now owns.
HANDOVER_SECONDS = 10.0


class Roles:
    def __init__(
        self, on_dropped: Callable[[str], object], handover_seconds: float = HANDOVER_SECONDS
    ) -> None:
        self._on_dropped = on_dropped
        self._handover_seconds = handover_seconds
        self._roles: dict[str, Role] = {}
        # What a job being handed over becomes once its handover ends (None: dropped).
        self._demoting: dict[str, Role | None] = {}
        self._demoted_now: list[str] = []

    def stands_by(self, name: str) -> bool:
        return self._roles.get(name) is Role.STANDBY

    def assign(self, name: str, role: Role | None) -> None:
        """The job's role here is now `role` (None: neither owner nor standby)."""
        current = self._roles.get(name)
        if current is None or role is Role.OWNER or role is current:
            self._demoting.pop(name, None)
            if role is not None:
                self._roles[name] = role
        elif self._demoting.get(name, current) is not role:
            self._demote(name, role)

    def forget(self, name: str) -> None:
        """The job is gone from the mirror (deleted, paused, ended)."""
        self._roles.pop(name, None)
        self._demoting.pop(name, None)

    def _demote(self, name: str, role: Role | None) -> None:
        # Demotions of one reconcile end their handover together, on one timer.
        if not self._demoted_now:
            asyncio.get_running_loop().call_soon(self._start_handover)
        self._demoting[name] = role
        self._demoted_now.append(name)

    def _start_handover(self) -> None:
        names, self._demoted_now = self._demoted_now, []
        asyncio.get_running_loop().call_later(self._handover_seconds, self._end_handover, names)

    def _end_handover(self, names: list[str]) -> None:
        for name in names:
            if name not in self._demoting:
                continue  # promoted again, or gone, meanwhile
            role = self._demoting.pop(name)
            if role is None:
                self.forget(name)
                self._on_dropped(name)
            else:
                self._roles[name] = role
