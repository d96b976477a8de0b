"""The cyclic garbage collector, set for a long-running server."""

import gc

# A request allocates thousands of containers that die with it (a listing, a job's
# models). At CPython's default first threshold (700) a busy replica ran young
# collections several times per request, each walking that request's objects; at this
# one most of them are freed by reference counting first.
YOUNG_THRESHOLD = 20_000


def settle_after_startup() -> None:
    """Once startup is done, what exists (modules, the app, the pools) lives as long as
    the process: frozen, later collections skip it, so a full collection no longer walks
    the whole heap. Freezing costs nothing; a collection first would stall a replica
    that has just read a large window for seconds, to free little."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
