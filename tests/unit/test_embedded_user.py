"""On a new machine, processes that start the embedded PostgreSQL together as root all
find its system account missing and make it at once; each must still get it."""

import multiprocessing
import os
import subprocess
import uuid
from collections.abc import Callable
from multiprocessing.synchronize import Barrier

import pytest

from service.embedded import ensure_system_user

MAKERS = 6


def _make_together(make: Callable[[str], object], name: str, barrier: Barrier) -> None:
    barrier.wait(timeout=30)  # all look for the account at the same moment
    make(name)


def makers_failing(make: Callable[[str], object], name: str) -> int:
    forks = multiprocessing.get_context("fork")
    barrier = forks.Barrier(MAKERS)
    makers = [
        forks.Process(target=_make_together, args=(make, name, barrier)) for _ in range(MAKERS)
    ]
    for maker in makers:
        maker.start()
    for maker in makers:
        maker.join(timeout=60)
    return sum(1 for maker in makers if maker.exitcode != 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a system account needs root")
def test_processes_making_the_system_account_together_all_get_it() -> None:
    # Unlocked, about one round in five lost makers here: five rounds to show it.
    for _ in range(5):
        name = f"tg{uuid.uuid4().hex[:10]}"
        try:
            assert makers_failing(ensure_system_user, name) == 0
        finally:
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
