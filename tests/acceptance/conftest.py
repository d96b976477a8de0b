"""Fixtures of the acceptance tests beyond the shared ones (tests/conftest.py)."""

from tests.support.pgbouncer import pgbouncer

__all__ = ["pgbouncer"]
