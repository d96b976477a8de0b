"""A stop asked for before anything serves: `tickgate serve` keeps its SIGTERM.

From its first moment `tickgate serve` handles SIGTERM with a `StopRequest`. Until the
server (uvicorn) or the supervisor installs a handler of its own, a SIGTERM is noted
here; each looks at it as it starts and stops at once. Without this, a SIGTERM that came
while a process was still importing, or starting the embedded PostgreSQL, was dropped,
and the process went on to serve: a pod whose scheduler failed at startup kept its API
up, never exiting for Kubernetes to restart it.

uvicorn puts this handler back when it has shut down and re-raises the signal it
handled: that one is noted too, harmlessly, where the default disposition would kill
the process before the embedded database is released.
"""

import logging
import signal
from types import FrameType

log = logging.getLogger(__name__)


class StopRequest:
    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def asked(self) -> bool:
        """A SIGTERM has arrived."""
        return self.signum is not None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal %d received", signum)
        self.signum = signum
