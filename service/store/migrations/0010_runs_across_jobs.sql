-- GET /v1/runs pages through every job's runs newest first: (started_at, id) descending,
-- continuing below the last page's position. The per-job index leads with `job`, so
-- without this one each page would sort the whole ledger.
CREATE INDEX tickgate_runs_all_newest ON tickgate_runs (started_at DESC, id DESC);
