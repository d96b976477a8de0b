-- Jobs an app fires through the APScheduler gate (#44): schedule kind 'app'. The API's
-- /metrics reads their last successes at each scrape: this index finds them without
-- reading every job.
CREATE INDEX tickgate_jobs_fired_by_app ON tickgate_jobs (name)
    WHERE schedule->>'kind' = 'app';
