"""The coalescer that turns many callers' writes into one batch."""

import asyncio
from collections.abc import Sequence

import pytest

from service.store.coalesce import Coalescer


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail
        self.database = asyncio.Event()  # a real flush waits on the database
        self.database.set()

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.database.wait()
        if self.fail:
            raise RuntimeError("database said no")
        return [item * 10 for item in items]


async def test_items_submitted_together_are_flushed_as_one_batch() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush, lambda: 0.01)
    results = await asyncio.gather(*(coalescer.submit(n) for n in range(5)))
    assert results == [0, 10, 20, 30, 40]  # each caller gets its own result
    assert recorder.batches == [[0, 1, 2, 3, 4]]


async def test_items_arriving_during_a_flush_form_the_next_batch() -> None:
    recorder = Recorder()
    recorder.database.clear()
    coalescer = Coalescer(recorder.flush, lambda: 0.0)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0)  # the first batch is being written now
    later = asyncio.gather(coalescer.submit(2), coalescer.submit(3))
    await asyncio.sleep(0)
    recorder.database.set()
    assert (await first, await later) == (10, [20, 30])
    assert recorder.batches == [[1], [2, 3]]


async def test_every_caller_of_a_failed_batch_gets_the_error() -> None:
    coalescer = Coalescer(Recorder(fail=True).flush, lambda: 0.01)
    outcomes = await asyncio.gather(
        *(coalescer.submit(n) for n in range(3)), return_exceptions=True
    )
    assert [str(o) for o in outcomes] == ["database said no"] * 3
    with pytest.raises(RuntimeError, match="database said no"):
        await coalescer.submit(4)


async def test_a_cancelled_first_caller_still_flushes_the_others() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.flush, lambda: 10.0)
    first = asyncio.ensure_future(coalescer.submit(1))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(coalescer.submit(2))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == 20
    assert recorder.batches == [[1, 2]]
