"""Schemathesis hooks (SCHEMATHESIS_HOOKS) that put the edge dates of #42 into generated
bodies (tests/support/edges.py)."""

from typing import Any

import hypothesis.strategies as st
import schemathesis

from tests.support.edges import EDGE_DATES

DATE_FIELDS = frozenset({"start_at", "end_at", "after", "from", "to", "anchor", "at"})


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Half the bodies as drawn; the rest with every date field set to one edge date."""
    if not isinstance(body, dict):
        return st.just(body)
    return st.sampled_from((None, *EDGE_DATES)).map(lambda edge: _with_edge(body, edge))


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
