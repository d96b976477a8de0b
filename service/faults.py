"""Faults a test injects into a replica on purpose: its scheduler's clock off, its fires
held back, its runs' ends recorded late, its hook deliveries held back.

In production there are none (`NONE`), and no setting or environment variable of the
service turns one on: the wheel carries no test switch. Only the harness builds others:
in process, it hands them to `create_app`; for a real `tickgate serve`, it runs the
server through `harness/faulty.py`, which calls `inject` before the supervisor forks its
children, so the children inherit them and `service.server` passes them on.
"""

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Faults:
    # The scheduler's clock runs this far ahead (negative: behind): it fires tick T when
    # its own clock reads T (service/scheduler/clock.py).
    clock_offset: timedelta = timedelta(0)
    # Every fire held back this long after its tick is due here.
    fire_delay: timedelta = timedelta(0)
    # Every run's end recorded this long after its task returned (a GC pause, a slow
    # commit).
    record_delay: timedelta = timedelta(0)
    # No hook delivery sent for this long after the replica starts (so a test can kill
    # it before it sends one it recorded).
    hook_delay: timedelta = timedelta(0)


NONE = Faults()

# The faults of this process: set once, before the server starts, by the harness alone.
_injected = NONE


def inject(faults: Faults) -> None:
    global _injected  # noqa: PLW0603 - one process-wide choice, made before serving
    _injected = faults


def injected() -> Faults:
    return _injected
