"""A statement's parameters by name, and the columns of its batches declared once.

A batched statement takes its rows as parallel arrays (`unnest`): one array per column,
each given as `$n::type[]`, then named again in the `AS t (...)` list, and built once
more, in the same order, as the argument tuple. Written by hand, the three lists drift
apart. Here one ordered table of columns (name, PostgreSQL type, the value of a row)
writes the `unnest` and builds the arrays, and every parameter, row arrays and scalars
alike, is asked for by name: `Params` numbers each the first time the text names it.
Numbers then exist only here; the text is the same on every build (it is prepared and
cached per connection), and `Statement.arguments` builds the tuple in that order.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Column(Generic[R]):
    """One column of a batch: its name in the statement, its PostgreSQL type, and its
    value in a row."""

    name: str
    sql_type: str
    value: Callable[[R], object]


class Columns(Generic[R]):
    """A batch's columns, in order."""

    def __init__(self, *columns: Column[R]) -> None:
        self.columns = columns
        self._by_name = {column.name: column for column in columns}

    def __getitem__(self, name: str) -> Column[R]:
        return self._by_name[name]

    @property
    def names(self) -> str:
        """The column list, as a statement names it: `name, lock_key, ...`."""
        return ", ".join(column.name for column in self.columns)

    def values(self, row: R) -> tuple[object, ...]:
        """One row as the values of its columns, in order."""
        return tuple(column.value(row) for column in self.columns)

    def arrays(self, rows: Iterable[R]) -> list[list[object]]:
        """Rows as one list per column: the arrays a statement unnests."""
        listed = list(rows)
        return [[column.value(row) for row in listed] for column in self.columns]


def one(name: str, sql_type: str) -> Columns[Any]:
    """A batch of one column, whose rows are its values."""
    return Columns(Column(name, sql_type, lambda value: value))


@dataclass(frozen=True)
class _Slot:
    argument: str
    column: Column[Any] | None  # None: the argument itself, not a column of its rows

    def value(self, arguments: Mapping[str, Any]) -> object:
        given = arguments[self.argument]
        if self.column is None:
            return given
        return [self.column.value(row) for row in given]


@dataclass(frozen=True)
class Statement:
    """A statement's text and how its arguments, given by name, line up."""

    text: str
    slots: tuple[_Slot, ...]

    def arguments(self, **given: Any) -> tuple[object, ...]:
        """The argument tuple: each scalar as given, each batch as its columns' arrays."""
        expected = {slot.argument for slot in self.slots}
        if given.keys() != expected:
            raise TypeError(f"arguments {sorted(given)}; the statement takes {sorted(expected)}")
        return tuple(slot.value(given) for slot in self.slots)


class Params:
    """The parameters of one statement, numbered in the order its text names them."""

    def __init__(self) -> None:
        self._slots: list[_Slot] = []
        self._numbers: dict[tuple[str, str | None], int] = {}

    def __call__(self, argument: str, sql_type: str | None = None) -> str:
        """The scalar `argument` (`$n`, cast to `sql_type` if given)."""
        number = self.place(argument)
        return f"${number}::{sql_type}" if sql_type else f"${number}"

    def rows(self, argument: str, columns: Columns[Any]) -> "Rows":
        """The batch `argument`, whose rows have `columns`."""
        return Rows(self, argument, columns)

    def statement(self, text: str) -> Statement:
        return Statement(text, tuple(self._slots))

    def place(self, argument: str, column: Column[Any] | None = None) -> int:
        """The number of `argument` (of its `column`, for a batch): the next one, the
        first time it is named."""
        key = (argument, column.name if column else None)
        if key not in self._numbers:
            self._slots.append(_Slot(argument, column))
            self._numbers[key] = len(self._slots)
        return self._numbers[key]


@dataclass(frozen=True)
class Rows:
    """One batch of a statement: its columns' arrays, as parameters."""

    params: Params
    argument: str
    columns: Columns[Any]

    def array(self, name: str) -> str:
        """The array of the column `name`: `$n::type[]`."""
        column = self.columns[name]
        return f"${self.params.place(self.argument, column)}::{column.sql_type}[]"

    def unnest(self, alias: str, *, ordinality: bool = False) -> str:
        """`unnest(...) AS alias (columns)`, a row per element; with `ordinality`, each
        row's place in the batch too, as `n` (from 1)."""
        arrays = ", ".join(self.array(column.name) for column in self.columns.columns)
        numbered = " WITH ORDINALITY" if ordinality else ""
        names = self.columns.names + (", n" if ordinality else "")
        return f"unnest({arrays}){numbered} AS {alias} ({names})"
