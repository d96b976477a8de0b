"""The statement the sql task's connections ask before a job's statement runs."""

# Whether this role is, or may become (SET ROLE), a superuser; and whether it may read or
# change any of Tickgate's tables in this database.
PRIVILEGES = r"""
SELECT EXISTS (SELECT FROM pg_roles r
               WHERE r.rolsuper AND pg_has_role(current_user, r.oid, 'MEMBER')) AS superuser,
       coalesce((SELECT bool_or(has_table_privilege(c.oid,
                                                    'SELECT, INSERT, UPDATE, DELETE, TRUNCATE'))
                 FROM pg_class c
                 WHERE c.relname LIKE 'tickgate\_%' AND c.relkind IN ('r', 'p', 'v', 'm')),
                false) AS tickgate
"""
