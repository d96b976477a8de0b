"""Schemathesis hooks (SCHEMATHESIS_HOOKS) that put the edge dates of #42 into generated
bodies: year 1 and year 9999, with offsets up to 14 hours either way. Their shape is
valid, so they reach the schedule math and the database, where overflows once were 500s."""

from typing import Any

import hypothesis.strategies as st
import schemathesis

EDGES = (
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
    "0001-01-09T00:00:00-14:00",
    "9999-12-31T00:00:00Z",
    "9999-12-31T23:00:00-05:00",
    "9999-11-29T00:00:00+14:00",
)
DATE_FIELDS = frozenset({"start_at", "end_at", "after", "from", "to", "anchor", "at"})


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Half the bodies as drawn; the rest with every date field set to one edge date."""
    if not isinstance(body, dict):
        return st.just(body)
    return st.sampled_from((None, *EDGES)).map(lambda edge: _with_edge(body, edge))


def _with_edge(value: Any, edge: str | None) -> Any:
    if edge is None:
        return value
    if isinstance(value, dict):
        return {
            key: edge if key in DATE_FIELDS and isinstance(item, str) else _with_edge(item, edge)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_with_edge(item, edge) for item in value]
    return value
