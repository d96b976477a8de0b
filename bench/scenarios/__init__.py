"""The scenarios, in the order a full run takes them. Each module has `NAME` and
`run(ctx: bench.common.Context) -> dict`; a result's `status` is `ok` or `skipped`."""

from collections.abc import Callable
from typing import Any

from bench.context import Context
from bench.scenarios import (
    api,
    bulk,
    burst,
    limit,
    peers,
    replicas,
    retention,
    scale,
    scale_out,
    steady,
    steady_log,
    tracing,
)

Scenario = Callable[[Context], dict[str, Any]]

SCENARIOS: dict[str, Scenario] = {
    limit.NAME: limit.run,
    steady.NAME: steady.run,
    steady_log.NAME: steady_log.run,
    burst.NAME: burst.run,
    api.NAME: api.run,
    bulk.NAME: bulk.run,
    scale.NAME: scale.run,
    retention.NAME: retention.run,
    scale_out.NAME: scale_out.run,
    replicas.NAME: replicas.run,
    peers.NAME: peers.run,
    tracing.NAME: tracing.run,
}
