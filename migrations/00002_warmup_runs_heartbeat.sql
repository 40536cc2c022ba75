-- A run's process writes heartbeat_at every 15 s while the run goes on (internal/runs). A row still 'running'
-- whose heartbeat stopped belongs to a process that died without finishing it (kill -9, a lost node): the next
-- run, or the next daemon start, marks it 'interrupted' instead of leaving it 'running' forever. Rows of
-- binaries from before this migration have no heartbeat and are left alone.

-- +goose Up
alter table keepwarm.warmup_runs add column heartbeat_at timestamptz default now();
update keepwarm.warmup_runs set heartbeat_at = null where status = 'running';

-- +goose Down
alter table keepwarm.warmup_runs drop column heartbeat_at;
