"""The fault timeline, and the thread that plays it.

For the full 30 minutes: `kill -9` of a replica every 5 minutes (at 5, 10, 15, 20 and
25), each restarted after 10 s down; PostgreSQL stopped and started again on its data
directory at 12 minutes (5 s down); the proxied replica's link blackholed at 18 minutes
for 75 s (both directions silent, no socket closed), then restored. A shorter run
compresses the times in proportion and has max(1, minutes / 5 - 1) kills; down times
and the blackhole shrink with it, to floors that still let a replica come back.

Kills alternate between the two directly connected replicas: the proxied one lives the
whole run, so one replica's memory is watched from warm-up to the end, across the
database restart and its own blackhole. Faults never overlap: each waits for the one
before it to be over (a restarted replica ready, PostgreSQL accepting connections), so
two replicas or more are always up.
"""

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.cluster import Slot
from harness.postgres import EmbeddedServer
from harness.tcpproxy import TcpProxy
from reliability.soak import Worker

FULL_MINUTES = 30.0
KILL_DOWN_SECONDS = 10.0
PG_DOWN_SECONDS = 5.0
BLACKHOLE_SECONDS = 75.0
PG_RESTART_AT = 0.4  # share of the run
BLACKHOLE_AT = 0.6
# The events at which a fault may take sessions away (and locks with them), noted as the
# fault begins.
SESSION_FAULTS = ("kill", "pg_stop", "blackhole")


@dataclass(frozen=True)
class Planned:
    at: float  # seconds into the run
    kind: str  # "kill", "pg_restart", "blackhole"
    seconds: float  # how long the fault lasts: down time, outage, silence
    slot: int | None = None


def timeline(minutes: float, killable: Sequence[int]) -> list[Planned]:
    """The faults of a run of `minutes`, in order."""
    length = minutes * 60
    scale = minutes / FULL_MINUTES
    kills = max(1, math.ceil(minutes / 5) - 1)
    planned = [
        Planned(
            length * k / (kills + 1),
            "kill",
            max(2.0, KILL_DOWN_SECONDS * scale),
            killable[(k - 1) % len(killable)],
        )
        for k in range(1, kills + 1)
    ]
    planned.append(Planned(length * PG_RESTART_AT, "pg_restart", PG_DOWN_SECONDS))
    planned.append(
        Planned(length * BLACKHOLE_AT, "blackhole", max(10.0, BLACKHOLE_SECONDS * scale))
    )
    return sorted(planned, key=lambda event: event.at)


@dataclass
class EventLog:
    """What happened when (time.time()), for the results and the plot. Thread-safe."""

    began: float
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, **detail: Any) -> None:
        now = time.time()
        with self._lock:
            self.events.append({"at": now, "t": round(now - self.began, 1), "kind": kind, **detail})
        print(
            f"[soak {time.strftime('%H:%M:%S')}] +{now - self.began:6.0f}s {kind} {detail}",
            flush=True,
        )

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def session_faults(self) -> list[float]:
        """When a fault could have taken sessions away: a kill, PostgreSQL's stop, a cut
        link (time.time())."""
        return [event["at"] for event in self.snapshot() if event["kind"] in SESSION_FAULTS]


class Faults(Worker):
    """Plays the timeline from `began` (time.time()); `error` holds what stopped it."""

    def __init__(
        self,
        planned: Sequence[Planned],
        *,
        began: float,
        slots: Sequence[Slot],
        database: EmbeddedServer,
        proxy: TcpProxy,
        log: EventLog,
        cluster_ready: Callable[[float], bool],
    ) -> None:
        super().__init__("soak-faults")
        self._planned = list(planned)
        self._began = began
        self._slots = slots
        self._database = database
        self._proxy = proxy
        self._log = log
        self._cluster_ready = cluster_ready
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for event in self._planned:
                if self._halt.wait(max(0.0, self._began + event.at - time.time())):
                    return
                getattr(self, f"_{event.kind}")(event)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            self.error = error
            self._log.note("fault_thread_failed", error=repr(error))

    def _kill(self, event: Planned) -> None:
        assert event.slot is not None
        slot = self._slots[event.slot]
        runner = slot.incarnations[-1].runner_id
        self._log.note("kill", slot=slot.index, runner=runner)
        slot.kill()
        self._halt.wait(event.seconds)
        slot.start()
        self._log.note("restart", slot=slot.index, runner=slot.incarnations[-1].runner_id)
        slot.wait_ready()
        self._log.note("ready", slot=slot.index, runner=slot.incarnations[-1].runner_id)

    def _pg_restart(self, event: Planned) -> None:
        self._log.note("pg_stop")
        self._database.stop()
        self._log.note("pg_stopped")
        self._halt.wait(event.seconds)
        self._database.start()
        self._log.note("pg_start")
        if self._cluster_ready(120.0):
            self._log.note("cluster_ready")
        else:
            self._log.note("cluster_not_ready_after_120s")

    def _blackhole(self, event: Planned) -> None:
        self._proxy.blackhole()
        self._log.note(
            "blackhole", slot=len(self._slots) - 1, open_connections=self._proxy.open_connections
        )
        self._halt.wait(event.seconds)
        self._proxy.restore()
        self._log.note("restore", slot=len(self._slots) - 1)
