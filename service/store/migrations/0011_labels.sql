-- Labels on jobs (service/domain/jobs.py): a JSON object of strings. Listing by labels
-- (`labels @> '{"team": "billing"}'`) and a pruning bulk apply scoped by them use the
-- GIN index; jsonb_path_ops indexes exactly the containment that both ask.
ALTER TABLE tickgate_jobs ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';
CREATE INDEX tickgate_jobs_labels ON tickgate_jobs USING gin (labels jsonb_path_ops);
