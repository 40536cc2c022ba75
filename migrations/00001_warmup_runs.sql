-- keepwarm's own tables live in the "keepwarm" schema, beside the application's tables, so that one DSN
-- serves both. goose keeps its version table there too (keepwarm.goose_db_version).

-- +goose Up
create schema if not exists keepwarm;

-- One row per warmup run: started by `keepwarm warmup` (cli), a [[schedule]] (cron) or the HTTP API (api).
create table keepwarm.warmup_runs (
    id             bigint generated always as identity primary key,
    name           text        not null,                    -- the schedule's name, or the CLI/API run's label
    trigger        text        not null check (trigger in ('cli', 'cron', 'api')),
    keyspace       text        not null,
    host           text        not null,                    -- the daemon (or CLI) host that ran it
    started_at     timestamptz not null default now(),
    finished_at    timestamptz,                             -- null while running
    status         text        not null default 'running'
                               check (status in ('running', 'ok', 'failed', 'interrupted')),
    requested      bigint      not null default 0 check (requested >= 0),      -- ids asked for
    written        bigint      not null default 0 check (written >= 0),        -- values written to Redis
    skipped_locked bigint      not null default 0 check (skipped_locked >= 0), -- ids whose lock another holder had
    missing        bigint      not null default 0 check (missing >= 0),        -- ids the origin did not have
    failed         bigint      not null default 0 check (failed >= 0),         -- ids that failed (origin or Redis error)
    error          text,                                    -- the run's error, when status is failed
    constraint warmup_runs_finished_when_done check ((status = 'running') = (finished_at is null))
);

-- Schedule dedupe: "did schedule X start a run since T?" and "the last runs of X".
create index warmup_runs_name_started_at on keepwarm.warmup_runs (name, started_at desc);

-- +goose Down
drop table keepwarm.warmup_runs;
