"""The scenarios, in the order a full run takes them. Each module has `NAME` and
`run(ctx: bench.common.Context) -> dict`; a result's `status` is `ok` or `skipped`."""

from collections.abc import Callable
from typing import Any

from bench.common import Context
from bench.scenarios import api, burst, limit, peers, scale, steady

Scenario = Callable[[Context], dict[str, Any]]

SCENARIOS: dict[str, Scenario] = {
    limit.NAME: limit.run,
    steady.NAME: steady.run,
    burst.NAME: burst.run,
    api.NAME: api.run,
    scale.NAME: scale.run,
    peers.NAME: peers.run,
}
