-- The time-zone database each member computes ticks with (IANA release and source, as
-- service/tzdb.py reads it): members that differ put the same job's ticks at different
-- instants around a zone's rule change, and each warns when it sees that.
ALTER TABLE tickgate_members ADD COLUMN tzdata text NOT NULL DEFAULT '';
