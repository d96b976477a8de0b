-- A job may keep neither its runs' output nor their log (#24): `capture` false.
ALTER TABLE tickgate_jobs ADD COLUMN capture boolean NOT NULL DEFAULT true;
