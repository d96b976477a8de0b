"""The connection type statements run on: a bare connection or one borrowed from a pool."""

from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

if TYPE_CHECKING:
    Connection: TypeAlias = asyncpg.Connection[Any] | PoolConnectionProxy[Any]
    Pool: TypeAlias = asyncpg.Pool[Any]
else:  # asyncpg's classes are generic only in its stubs
    Connection = asyncpg.Connection | PoolConnectionProxy
    Pool = asyncpg.Pool
