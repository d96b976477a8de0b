-- A job's recent hook deliveries, newest first (GET /v1/jobs/{name}/hooks).
CREATE INDEX tickgate_hook_deliveries_of_job ON tickgate_hook_deliveries (job, created_at DESC);
