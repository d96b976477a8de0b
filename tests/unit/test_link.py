"""The link bounds the docs promise follow from TICKGATE_DB_LINK_TIMEOUT_SECONDS."""

from service.config import Settings
from service.store.link import Link


def test_the_default_bounds_are_the_documented_ones() -> None:
    link = Link(Settings(database_url="postgresql://x/y").db_link_timeout_seconds)
    assert (link.heartbeat_seconds, link.statement_seconds, link.fence_seconds) == (5, 10, 15)
    assert link.server_settings(quiet_ends=True, fire_path=True) == {
        "tcp_keepalives_idle": 10,
        "tcp_keepalives_interval": 5,
        "tcp_keepalives_count": 3,
        "tcp_user_timeout": 30_000,
        "idle_session_timeout": 20_000,
        "idle_in_transaction_session_timeout": 20_000,
        "statement_timeout": 5_000,
        "lock_timeout": 3_000,
    }
    # A pool connection gets keepalives only: it idles between requests, and API
    # statements (a bulk apply, a migration) may take long.
    assert set(link.server_settings(quiet_ends=False, fire_path=False)) == {
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
    }


def test_a_silent_replica_stops_before_its_locks_are_freed() -> None:
    for seconds in (10, 30, 120, 3600):
        link = Link(seconds)
        settings = link.server_settings(quiet_ends=True, fire_path=True)
        keepalives_give_up = (
            settings["tcp_keepalives_idle"]
            + settings["tcp_keepalives_interval"] * settings["tcp_keepalives_count"]
        )
        # The fence trips before the server could end the session either way, and the
        # quiet session is ended first, at the bound documented.
        quiet_ends = settings["idle_session_timeout"] / 1000
        assert link.fence_seconds < quiet_ends <= keepalives_give_up
        assert quiet_ends == round(link.free_seconds, 3) < link.seconds
        # The server ends a slow statement before the client gives up on it.
        assert settings["statement_timeout"] / 1000 < link.statement_seconds
        assert settings["lock_timeout"] < settings["statement_timeout"]
