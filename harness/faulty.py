"""`tickgate serve` with faults injected on purpose (service/faults.py).

`python -m harness.faulty serve ...` is `tickgate serve ...` with the faults that
`FAULTS_VARIABLE` holds (JSON: a field of `Faults` -> milliseconds), injected before
the supervisor forks its children. Only this module reads that variable; the service
has no setting for faults. `start_replica` runs a replica this way when its environment
carries the variable (`faulty`).
"""

import json
import os
from datetime import timedelta

from service.faults import Faults, inject

FAULTS_VARIABLE = "TICKGATE_HARNESS_FAULTS"


def faulty(**milliseconds: int) -> dict[str, str]:
    """The environment of a replica with these faults: `faulty(fire_delay=300)`."""
    Faults(**{field: timedelta(0) for field in milliseconds})  # unknown fields raise here
    return {FAULTS_VARIABLE: json.dumps(milliseconds)}


def faults_from(text: str) -> Faults:
    fields = json.loads(text)
    return Faults(**{field: timedelta(milliseconds=ms) for field, ms in fields.items()})


def main() -> None:
    from service import cli  # the server's imports, only when serving

    inject(faults_from(os.environ.pop(FAULTS_VARIABLE, "{}")))
    cli.main()


if __name__ == "__main__":
    main()
