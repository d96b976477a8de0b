"""Fixtures of the fault tests: a receiver counting deliveries, and a SQL connection."""

from collections.abc import Iterator

import pytest

from tests.faults.helpers import Sql
from tests.support.receiver import Receiver, receiving


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as started:
        yield started


@pytest.fixture
def sql(database_url: str) -> Iterator[Sql]:
    connection = Sql(database_url)
    try:
        yield connection
    finally:
        connection.close()
