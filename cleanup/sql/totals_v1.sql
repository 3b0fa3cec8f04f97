-- The totals of the ledger and of the outbox: one row per policy (family 'policy') or
-- per event name (family 'event'), its figures one JSON object of whole numbers.
--
-- A policy's figures are its counters (rows deleted, deliveries, ...: they only ever
-- grow, and keep what the retention purge deletes) and its gauges: 'state_<state>', its
-- chunks in each state the ledger keeps now, and 'running', its runs not finished. Each
-- change of a chunk or a run adds what it changed, in its own transaction, as that
-- transaction's last statement (the triggers below are deferred to the commit), so a
-- scrape reads these few rows however large the ledger grows, and the row lock a
-- commit takes here is held for the commit alone. The engine's Python writes the
-- ledger (cleanup.engine.transitions); nothing but these triggers and the outbox's
-- settling statements writes the totals.
--
-- An event name's figures are how many of its events were delivered and discarded,
-- counted by the statement that settles each (cleanup.outbox.events).
--
-- Versioned: a later change comes as totals_v2.sql with its own migration, so workers of
-- the release before and after can run side by side during a deploy.

-- Add ``delta`` to the subject's figures, key by key. (The functions are PL/pgSQL for
-- their plans, kept for the session: a SQL function called from a trigger is planned
-- again at every call.)
CREATE OR REPLACE FUNCTION cleanup_total_add_v1(of_family text, of_subject text, delta jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF delta = '{}'::jsonb THEN
        RETURN;
    END IF;
    INSERT INTO cleanup_total AS total (family, subject, figures)
    VALUES (of_family, of_subject, delta)
    ON CONFLICT ON CONSTRAINT total_unique_subject
    DO UPDATE SET figures = cleanup_figures_sum_v1(total.figures, excluded.figures);
END
$$;

-- ``figures`` plus ``delta``, key by key. A figure edited by hand into something that
-- is not a whole number in range counts from 0 again: it never stops the commit that
-- adds to it.
CREATE OR REPLACE FUNCTION cleanup_figures_sum_v1(figures jsonb, delta jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    kept jsonb := CASE WHEN jsonb_typeof(figures) = 'object' THEN figures ELSE '{}' END;
BEGIN
    RETURN kept || (
        SELECT jsonb_object_agg(key, value::bigint + CASE
                   WHEN jsonb_typeof(kept -> key) = 'number'
                        AND abs((kept ->> key)::numeric) < 9e18
                   THEN trunc((kept ->> key)::numeric)::bigint ELSE 0 END)
        FROM jsonb_each_text(delta));
END
$$;

-- What a chunk's change adds to its policy's figures (``before`` null: a new chunk):
-- its counters' growth, its move in the two histograms (duration in ms once committed,
-- rows changed; the buckets are cleanup.observability.counters' DURATION_BUCKETS_MS
-- and ROWS_BUCKETS, a test pins them), and its state's gauges. A counter never goes
-- down, whatever a row edited by hand says.
CREATE OR REPLACE FUNCTION cleanup_chunk_change_v1(before cleanup_chunk, after cleanup_chunk)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    was_committed boolean := coalesce(before.committed_at IS NOT NULL, false);
    committed boolean := after.committed_at IS NOT NULL;
    was_timed boolean := was_committed AND before.duration_ms IS NOT NULL;
    timed boolean := committed AND after.duration_ms IS NOT NULL;
    had bigint := coalesce(before.rows_deleted + before.rows_updated, 0);
    has bigint := after.rows_deleted + after.rows_updated;
    delta jsonb;
BEGIN
    delta := jsonb_strip_nulls(jsonb_build_object(
        'deliveries', nullif(greatest(after.deliveries - coalesce(before.deliveries, 0), 0), 0),
        'rows_deleted',
        nullif(greatest(after.rows_deleted - coalesce(before.rows_deleted, 0), 0), 0),
        'rows_updated',
        nullif(greatest(after.rows_updated - coalesce(before.rows_updated, 0), 0), 0),
        'noop_deliveries',
        nullif(greatest(after.noop_deliveries - coalesce(before.noop_deliveries, 0), 0), 0),
        'items_skipped',
        nullif(greatest(after.items_skipped - coalesce(before.items_skipped, 0), 0), 0),
        'rows_locked', nullif(greatest(after.rows_locked - coalesce(before.rows_locked, 0), 0), 0),
        'retryable_failures',
        nullif(greatest(after.transient_retries + after.failures
                        - coalesce(before.transient_retries + before.failures, 0), 0), 0),
        'dead_lettered',
        nullif(greatest(after.dead_letters - coalesce(before.dead_letters, 0), 0), 0),
        'reconciled', nullif(greatest(after.reconciles - coalesce(before.reconciles, 0), 0), 0),
        'chunks_committed', nullif(greatest(committed::int - was_committed::int, 0), 0),
        'rows_count', nullif(greatest(committed::int - was_committed::int, 0), 0),
        'rows_sum', nullif(greatest(CASE WHEN committed THEN has ELSE 0 END
                                    - CASE WHEN was_committed THEN had ELSE 0 END, 0), 0),
        'duration_count', nullif(greatest(timed::int - was_timed::int, 0), 0),
        'duration_sum_ms',
        nullif(greatest(CASE WHEN timed THEN after.duration_ms ELSE 0 END
                        - CASE WHEN was_timed THEN before.duration_ms ELSE 0 END, 0), 0)));
    IF before.state IS DISTINCT FROM after.state THEN
        delta := delta || jsonb_build_object('state_' || after.state, 1);
        IF before.state IS NOT NULL THEN
            delta := delta || jsonb_build_object('state_' || before.state, -1);
        END IF;
    END IF;
    IF (was_timed, before.duration_ms) IS DISTINCT FROM (timed, after.duration_ms) THEN
        delta := delta || coalesce((
            SELECT jsonb_object_agg('duration_le_' || bound, moved)
            FROM (SELECT bound, greatest((timed AND after.duration_ms <= bound)::int
                                         - (was_timed AND before.duration_ms <= bound)::int,
                                         0) AS moved
                  FROM unnest(ARRAY[5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
                                    30000]) AS bound) AS buckets
            WHERE moved <> 0), '{}'::jsonb);
    END IF;
    IF (was_committed, had) IS DISTINCT FROM (committed, has) THEN
        delta := delta || coalesce((
            SELECT jsonb_object_agg('rows_le_' || bound, moved)
            FROM (SELECT bound, greatest((committed AND has <= bound)::int
                                         - (was_committed AND had <= bound)::int, 0) AS moved
                  FROM unnest(ARRAY[0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000]) AS bound
                 ) AS buckets
            WHERE moved <> 0), '{}'::jsonb);
    END IF;
    RETURN delta;
END
$$;

-- What a run's change adds to its policy's figures (``before`` null: a new run).
CREATE OR REPLACE FUNCTION cleanup_run_change_v1(before cleanup_run, after cleanup_run)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'runs_' || after.trigger, CASE WHEN before.id IS NULL THEN 1 END,
        'candidates_found',
        nullif(greatest(after.candidates - coalesce(before.candidates, 0), 0), 0),
        'messages_sent',
        nullif(greatest(after.messages_sent - coalesce(before.messages_sent, 0), 0), 0),
        'running', nullif((after.state = 'running')::int
                          - coalesce((before.state = 'running')::int, 0), 0)));
END
$$;

-- A chunk written: what it changed, added at the commit.
CREATE OR REPLACE FUNCTION cleanup_count_chunk_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cleanup_total_add_v1(
        'policy', run.policy,
        cleanup_chunk_change_v1(CASE WHEN TG_OP = 'UPDATE' THEN OLD END, NEW))
    FROM cleanup_run AS run WHERE run.id = NEW.run_id;
    RETURN NULL;
END
$$;

-- A run written: likewise.
CREATE OR REPLACE FUNCTION cleanup_count_run_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cleanup_total_add_v1(
        'policy', NEW.policy, cleanup_run_change_v1(CASE WHEN TG_OP = 'UPDATE' THEN OLD END, NEW));
    RETURN NULL;
END
$$;

-- Chunks or runs purged: their gauges go, their counters stay. Counted as the DELETE
-- ends, while the runs of the chunks it took are still there to name their policies,
-- in policy order (concurrent purges take the rows' locks in one order).
CREATE OR REPLACE FUNCTION cleanup_count_gone_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'cleanup_chunk' THEN
        PERFORM cleanup_total_add_v1('policy', policy, gauges)
        FROM (SELECT run.policy, jsonb_object_agg('state_' || g.state, -g.chunks) AS gauges
              FROM (SELECT run_id, state, count(*) AS chunks FROM gone GROUP BY 1, 2) AS g
              JOIN cleanup_run AS run ON run.id = g.run_id
              GROUP BY run.policy ORDER BY run.policy) AS per_policy;
    ELSE
        PERFORM cleanup_total_add_v1('policy', policy, jsonb_build_object('running', -runs))
        FROM (SELECT policy, count(*) AS runs FROM gone WHERE state = 'running'
              GROUP BY policy ORDER BY policy) AS per_policy;
    END IF;
    RETURN NULL;
END
$$;

-- An update that changes no figure (a delivery's history, a run's frontier) is not
-- counted at all: the WHEN compares the columns the figures read.
CREATE CONSTRAINT TRIGGER cleanup_count_new_chunk_v1 AFTER INSERT ON cleanup_chunk
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cleanup_count_chunk_v1();
CREATE CONSTRAINT TRIGGER cleanup_count_chunk_change_v1 AFTER UPDATE ON cleanup_chunk
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN ((OLD.state, OLD.deliveries, OLD.rows_deleted, OLD.rows_updated, OLD.noop_deliveries,
           OLD.items_skipped, OLD.rows_locked, OLD.transient_retries, OLD.failures,
           OLD.dead_letters, OLD.reconciles, OLD.committed_at, OLD.duration_ms)
          IS DISTINCT FROM
          (NEW.state, NEW.deliveries, NEW.rows_deleted, NEW.rows_updated, NEW.noop_deliveries,
           NEW.items_skipped, NEW.rows_locked, NEW.transient_retries, NEW.failures,
           NEW.dead_letters, NEW.reconciles, NEW.committed_at, NEW.duration_ms))
    EXECUTE FUNCTION cleanup_count_chunk_v1();
CREATE CONSTRAINT TRIGGER cleanup_count_new_run_v1 AFTER INSERT ON cleanup_run
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cleanup_count_run_v1();
CREATE CONSTRAINT TRIGGER cleanup_count_run_change_v1 AFTER UPDATE ON cleanup_run
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN ((OLD.state, OLD.trigger, OLD.candidates, OLD.messages_sent)
          IS DISTINCT FROM (NEW.state, NEW.trigger, NEW.candidates, NEW.messages_sent))
    EXECUTE FUNCTION cleanup_count_run_v1();
CREATE TRIGGER cleanup_count_gone_chunks_v1 AFTER DELETE ON cleanup_chunk
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION cleanup_count_gone_v1();
CREATE TRIGGER cleanup_count_gone_runs_v1 AFTER DELETE ON cleanup_run
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION cleanup_count_gone_v1();
