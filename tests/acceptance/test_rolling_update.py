"""A rolling update, as a Deployment does one: three replicas replaced one at a time (a
new one started and ready, then SIGTERM to an old one), under 120 one-second webhook
jobs. Every tick of the whole update is delivered exactly once, and none is skipped.
"""

import time
from pathlib import Path

from harness.accounting import await_accounting
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica, start_replica, stop_all, wait_ready
from tests.support.cluster import (
    create_all,
    every_second_specs,
    next_whole_second,
    report,
    sleep_until,
)

# After the last old replica has gone, the window goes on this long: the ticks the
# new replicas carry alone count too.
AFTER_SECONDS = 3


def test_a_rolling_update_delivers_every_tick_once_and_skips_none(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    with serve_many(tmp_path, 3, database_url=database_url) as old:
        specs, periods = every_second_specs(receiver, {"cron": 60, "interval": 60}, prefix="roll-")
        create_all(old, specs)
        first = next_whole_second(time.time(), 2)
        sleep_until(first)
        new: list[Replica] = []
        try:
            for index, leaving in enumerate(old):
                arriving = start_replica(
                    tmp_path, database_url=database_url, runner_id=f"new-{index}"
                )
                new.append(arriving)
                wait_ready([arriving])
                assert leaving.stop() == 0, leaving.log_tail()
            last = int(time.time()) + AFTER_SECONDS
            sleep_until(last + 1)
            accounting = await_accounting(receiver, sql, periods, first, last, deadline_seconds=60)
            everyone = [*old, *new]
            assert not accounting.problems(), report(accounting.problems(), everyone)
            assert not receiver.duplicates(), report(receiver.duplicates(), everyone)
        finally:
            stop_all(new)
