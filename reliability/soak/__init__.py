"""The soak run (issue #13, "months unattended"): `python -m reliability.soak --minutes 30`.

Three real `tickgate serve` replicas run 2,000 jobs for a long while, under steady API
churn and a schedule of faults, and the harness checks that nothing drifts:

- `plan`: the job mix (every-second and every-5 s intervals, 5 s and 10 s crons; half
  `log`, half `http` to the loopback receiver), whose ticks all fall on whole multiples
  of the job's period, so the harness knows every nominal tick without a cron parser;
  the fleet's history (every change the harness made, and when); the churn thread.
- the cluster comes from `harness`: the embedded PostgreSQL (`harness.postgres`,
  restartable on its data directory), the replica slots (`harness.cluster.Slot`: kill -9,
  restart), and the TCP proxy in front of one replica (`harness.tcpproxy`).
- `faults`: the fault timeline, compressed with `--minutes`.
- `sampler`: every ~10 s, RSS per replica, ledger rows, fire lateness, runs/s and each
  replica's `/metrics` scrape time.
- `windows`: window by window, every nominal tick of every job that lived through the
  window unchanged has exactly one ledger row, and the receiver agrees with the ledger.
- `verdicts`, `reliability`, `plot`: the judgement, the RELIABILITY.md section and the
  PNG plot, each from the results JSON alone (`python -m reliability.soak --report FILE`).
"""

import threading


class Worker(threading.Thread):
    """One of the soak's daemon threads; `stop()` sets `_halt`, which its loop waits on."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
