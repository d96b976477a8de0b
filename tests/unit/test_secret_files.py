"""Secret settings read from mounted files (`DATABASE_URL_FILE`, `TICKGATE_SQL_TARGETS_FILE`,
`TICKGATE_SQL_SELF_URL_FILE`): what an operator gets right and wrong, said in one line
that never quotes the file."""

import json
from pathlib import Path

import pytest

from service.config import ConfigurationError, Settings, with_secret_files
from service.supervisor import _shared_environment

DSN = "postgresql://tickgate:s3cr%22et@db:5432/tickgate"


def _settings(**given: object) -> Settings:
    """Settings of `given` alone, whatever the environment running the tests sets."""
    unset: dict[str, object] = {"database_url": None, "sql_targets": {}, "sql_self_url": None}
    return Settings(**(unset | given))


def test_each_file_is_read_in(tmp_path: Path) -> None:
    (tmp_path / "dsn").write_text(DSN + "\n")
    (tmp_path / "targets").write_text(json.dumps({"app": DSN}))
    settings = _settings(
        database_url_file=tmp_path / "dsn",
        sql_targets_file=tmp_path / "targets",
        sql_self_url_file=tmp_path / "dsn",
    )
    read = with_secret_files(settings)
    assert (read.database_url, read.sql_targets, read.sql_self_url) == (DSN, {"app": DSN}, DSN)


def test_a_value_and_its_file_together_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dsn").write_text(DSN)
    settings = _settings(database_url=DSN, database_url_file=tmp_path / "dsn")
    with pytest.raises(ConfigurationError, match="set DATABASE_URL or DATABASE_URL_FILE, not both"):
        with_secret_files(settings)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    settings = _settings(sql_targets_file=tmp_path / "nowhere.json")
    with pytest.raises(
        ConfigurationError, match=r"TICKGATE_SQL_TARGETS_FILE: cannot read .*nowhere"
    ):
        with_secret_files(settings)


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("sql_targets_file", '{"app": "' + DSN + '", '),  # cut short
        ("sql_targets_file", json.dumps({"app": [DSN]})),
        ("database_url_file", DSN + "\n" + DSN),
        ("sql_self_url_file", ""),
    ],
)
def test_a_file_that_holds_the_wrong_thing_is_refused_without_quoting_it(
    tmp_path: Path, field: str, text: str
) -> None:
    (tmp_path / "file").write_text(text)
    settings = _settings(**{field: tmp_path / "file"})
    with pytest.raises(ConfigurationError, match="does not hold what") as refused:
        with_secret_files(settings)
    assert "s3cr" not in str(refused.value)


def test_the_children_learn_a_dsn_from_a_file_as_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tickgate serve` forks its children, which set their environment in memory, where
    /proc does not show it (the acceptance test reads /proc): what the supervisor gives
    them holds the files' names, never the DSNs read from them."""
    (tmp_path / "dsn").write_text(DSN)
    monkeypatch.setenv("DATABASE_URL_FILE", str(tmp_path / "dsn"))
    monkeypatch.setenv("TICKGATE_SQL_SELF_URL_FILE", str(tmp_path / "dsn"))
    read = with_secret_files(
        _settings(database_url_file=tmp_path / "dsn", sql_self_url_file=tmp_path / "dsn")
    )
    environment = _shared_environment(read)
    assert environment["DATABASE_URL_FILE"] == str(tmp_path / "dsn")
    assert not {"DATABASE_URL", "TICKGATE_SQL_SELF_URL"} & set(environment)
    assert DSN not in "\n".join(environment.values())
