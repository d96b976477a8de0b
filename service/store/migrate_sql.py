"""Every statement of the migrator (service/store/migrate.py), one constant each."""

from service.store.columns import Column, Columns, Params

# Serialises migrators: replicas that start together wait here (blocking is right for a
# startup step, unlike on the fire path). A session lock, since each migration commits
# on its own: released by UNLOCK (or by closing the connection).
LOCK = "SELECT pg_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"

# The waits for a table lock of the statements that follow, in this transaction only:
# a migration that waits past it gives the lock queue up, so the claims of the replicas
# still running queue behind it for at most that long.
SHORT_LOCK_WAIT = "SELECT set_config('lock_timeout', $1, true)"

# The record of applied migrations. A database made before checksums were kept has the
# table without `checksum`: it is added here, and filled by the migrator on its first
# start (the files as they stand are trusted once).
BOOTSTRAP = """CREATE TABLE IF NOT EXISTS tickgate_schema_migrations (
        version    integer PRIMARY KEY,
        name       text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        checksum   text);
    ALTER TABLE tickgate_schema_migrations ADD COLUMN IF NOT EXISTS checksum text"""

VERSIONS = "SELECT version FROM tickgate_schema_migrations"
APPLIED = "SELECT version, name, checksum FROM tickgate_schema_migrations ORDER BY version"

RECORD = "INSERT INTO tickgate_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"

# A migration renumbered on a merge (its old number and its name) recorded again under
# its new number, unless that number is taken (then the check that follows names the
# conflict).
_renumbering = Params()
_old, _name, _new = _renumbering("old"), _renumbering("name"), _renumbering("new")
RENUMBER = _renumbering.statement(f"""UPDATE tickgate_schema_migrations SET version = {_new}
    WHERE version = {_old} AND name = {_name}
      AND NOT EXISTS (SELECT 1 FROM tickgate_schema_migrations WHERE version = {_new})""")

# The checksums of migrations applied before checksums were kept: those of the files
# (`files`: version, checksum), trusted as they are. A checksum recorded is never changed.
CHECKSUM_COLUMNS: Columns[tuple[int, str]] = Columns(
    Column("version", "integer", lambda f: f[0]),
    Column("checksum", "text", lambda f: f[1]),
)
_trusting = Params()
TRUST_ON_FIRST_USE = _trusting.statement(f"""UPDATE tickgate_schema_migrations AS m
    SET checksum = f.checksum
    FROM {_trusting.rows("files", CHECKSUM_COLUMNS).unnest("f")}
    WHERE m.version = f.version AND m.checksum IS NULL""")

# The newest migration applied: the readiness ping compares it with this release's head.
NEWEST = "SELECT max(version) FROM tickgate_schema_migrations"
