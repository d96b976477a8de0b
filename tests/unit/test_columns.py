"""A statement built from a column table: its `unnest` and its arguments line up, by
name, whatever order the text names them in (#43)."""

import pytest

from service.store import fire_sql
from service.store.columns import Column, Columns, Params, one

PAIRS: Columns[tuple[str, int]] = Columns(
    Column("job", "text", lambda row: row[0]),
    Column("count", "int", lambda row: row[1]),
)


def _statement() -> tuple[str, Params]:
    p = Params()
    pairs = p.rows("pairs", PAIRS)
    text = (
        f"SELECT * FROM {pairs.unnest('t', ordinality=True)} "
        f"WHERE t.job <> {p('skipped')} AND t.job = ANY({pairs.array('job')}) "
        f"AND {p('skipped')} IS NOT NULL"
    )
    return text, p


def test_the_unnest_and_the_arguments_come_from_one_table() -> None:
    text, p = _statement()
    statement = p.statement(text)
    assert statement.text == (
        "SELECT * FROM unnest($1::text[], $2::int[]) WITH ORDINALITY AS t (job, count, n) "
        "WHERE t.job <> $3 AND t.job = ANY($1::text[]) AND $3 IS NOT NULL"
    )
    arguments = statement.arguments(skipped="c", pairs=[("a", 1), ("b", 2)])
    assert arguments == (["a", "b"], [1, 2], "c")


def test_a_statement_takes_exactly_its_arguments() -> None:
    text, p = _statement()
    statement = p.statement(text)
    with pytest.raises(TypeError, match="skipped"):
        statement.arguments(pairs=[])
    with pytest.raises(TypeError, match="extra"):
        statement.arguments(pairs=[], skipped="c", extra=1)


def test_a_statement_built_again_reads_the_same() -> None:
    """Statements are prepared and cached per connection by their text."""
    assert _statement()[0] == _statement()[0]
    assert fire_sql.claim_statement(counted=False).text == fire_sql.CLAIM.text


def test_a_batch_of_one_column_is_its_values() -> None:
    p = Params()
    text = f"SELECT u.key FROM {p.rows('keys', one('key', 'bigint')).unnest('u')}"
    assert text == "SELECT u.key FROM unnest($1::bigint[]) AS u (key)"
    assert p.statement(text).arguments(keys=[7, None]) == ([7, None],)


def test_the_claim_takes_a_row_per_tick_and_its_scalars_by_name() -> None:
    """The claim's numbers live only in its builder: its arguments are its columns'
    arrays, then the keys the session holds and the runner."""
    arguments = fire_sql.claim_arguments([], held={5})
    assert arguments == ([],) * len(fire_sql.CLAIM_COLUMNS.columns) + ([5], "")
