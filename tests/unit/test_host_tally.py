"""The per-host tally behind /metrics stays bounded (#42): a job author can aim runs at
any number of host:port pairs, and each host is a few series."""

from service.tasks.hosts import HostTally


def test_past_its_bound_the_tally_forgets_the_least_recently_used_idle_host() -> None:
    tally = HostTally(max_hosts=2)
    tally.of("a:1").open = 1  # a connection open: never forgotten
    tally.of("b:1")
    tally.of("c:1")
    assert set(tally.snapshot()) == {"a:1", "c:1"}
    tally.of("a:1").open = 0
    tally.of("c:1")  # now the most recent; a:1 the least
    tally.of("d:1")
    assert set(tally.snapshot()) == {"c:1", "d:1"}
    assert len(tally.snapshot()) == 2
