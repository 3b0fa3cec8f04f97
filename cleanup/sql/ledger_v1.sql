-- The ledger's other transitions, as the database's own functions: a run created as
-- dispatch froze it, the rows eligible at dispatch, a planning error kept, messages
-- sent and re-sent counted, planned chunks marked enqueued, a chunk acknowledged, and
-- an operator's requeue, discard and cancel. cleanup.engine.transitions is their only
-- caller.
--
-- Versioned as delivery_v1.sql is.

-- A run, as dispatch froze it (``run``: its row as JSON, every column given).
CREATE OR REPLACE FUNCTION cleanup_run_created_v1(run jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cleanup_run SELECT * FROM jsonb_populate_record(NULL::cleanup_run, run);
END
$$;

-- The rows eligible at dispatch, recorded once (a fact of the dispatch, like its
-- cutoff); false if they had been recorded already.
CREATE OR REPLACE FUNCTION cleanup_run_eligible_v1(of_run uuid, eligible bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_run SET eligible_at_dispatch = eligible
    WHERE id = of_run AND eligible_at_dispatch IS NULL;
    RETURN FOUND;
END
$$;

-- Why planning the run's next chunk failed (it is tried again later).
CREATE OR REPLACE FUNCTION cleanup_run_planning_failed_v1(of_run uuid, error text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_run SET planning_error = error WHERE id = of_run;
END
$$;

-- Messages sent (first sends and re-sends), per run (``sent``: run id -> count).
-- Counted on the run, not its chunks: a chunk row may be locked by a delivery in
-- progress, and a re-send must not wait for it.
CREATE OR REPLACE FUNCTION cleanup_runs_sent_v1(sent jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_run AS run SET messages_sent = run.messages_sent + counted.value::integer
    FROM jsonb_each_text(sent) AS counted
    WHERE run.id = counted.key::uuid;
END
$$;

-- planned -> enqueued, as their messages are sent; how many moved.
CREATE OR REPLACE FUNCTION cleanup_chunks_enqueued_v1(ids bigint[], at timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    moved integer;
BEGIN
    UPDATE cleanup_chunk SET state = 'enqueued', enqueued_at = at
    WHERE id = ANY(ids) AND state = 'planned';
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END
$$;

-- Chunks the reconciler re-sent.
CREATE OR REPLACE FUNCTION cleanup_chunks_reconciled_v1(ids bigint[], at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_chunk AS chunk SET reconciled_at = at, reconciles = chunk.reconciles + 1
    WHERE chunk.id = ANY(ids);
END
$$;

-- committed -> acknowledged, once the broker has acknowledged the chunk's message.
CREATE OR REPLACE FUNCTION cleanup_chunk_acknowledged_v1(of_run uuid, chunk_no integer,
                                                         at timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_chunk SET state = 'acknowledged', acknowledged_at = at
    WHERE run_id = of_run AND chunk_id = chunk_no AND state = 'committed';
    RETURN FOUND;
END
$$;

-- dead_lettered -> enqueued, unless the run was cancelled: the chunks locked in id
-- order, then their runs (the order a committing worker takes its locks in), and only
-- then is "not cancelled" settled, so a cancel that committed meanwhile is seen. The
-- deliveries that never completed are set aside, so the poison limit counts afresh;
-- the counters themselves keep adding. Returns the chunks requeued, as they are now.
CREATE OR REPLACE FUNCTION cleanup_chunks_requeued_v1(ids bigint[], at timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    dead bigint[];
    requeued jsonb;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO dead FROM (
        SELECT chunk.id FROM cleanup_chunk AS chunk
        WHERE chunk.id = ANY(ids) AND chunk.state = 'dead_lettered'
        ORDER BY chunk.id FOR UPDATE) AS locked;
    PERFORM FROM (SELECT run.id FROM cleanup_run AS run
                  WHERE run.id IN (SELECT run_id FROM cleanup_chunk WHERE id = ANY(dead))
                    AND run.state = 'cancelled'
                  ORDER BY run.created_at, run.id FOR UPDATE) AS locked;
    WITH moved AS (
        UPDATE cleanup_chunk AS chunk
        SET unfinished_forgiven = chunk.deliveries - chunk.deliveries_completed,
            state = 'enqueued', enqueued_at = at
        WHERE chunk.id = ANY(dead) AND chunk.state = 'dead_lettered'
          AND (SELECT run.state FROM cleanup_run AS run WHERE run.id = chunk.run_id)
              <> 'cancelled'
        RETURNING chunk.*)
    SELECT coalesce(jsonb_agg(to_jsonb(moved) ORDER BY moved.id), '[]'::jsonb)
    INTO requeued FROM moved;
    RETURN requeued;
END
$$;

-- dead_lettered -> discarded, with a reason; returns the chunks discarded.
CREATE OR REPLACE FUNCTION cleanup_chunks_discarded_v1(ids bigint[], reason text,
                                                       at timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    discarded jsonb;
BEGIN
    PERFORM FROM (SELECT chunk.id FROM cleanup_chunk AS chunk
                  WHERE chunk.id = ANY(ids) AND chunk.state = 'dead_lettered'
                  ORDER BY chunk.id FOR UPDATE) AS locked;
    WITH moved AS (
        UPDATE cleanup_chunk AS chunk
        SET state = 'discarded', discard_reason = reason, discarded_at = at
        WHERE chunk.id = ANY(ids) AND chunk.state = 'dead_lettered'
        RETURNING chunk.*)
    SELECT coalesce(jsonb_agg(to_jsonb(moved) ORDER BY moved.id), '[]'::jsonb)
    INTO discarded FROM moved;
    RETURN discarded;
END
$$;

-- running -> cancelled, and each run's unfinished chunks -> cancelled. Chunks are
-- locked before runs: the order a committing worker takes its locks in. A chunk
-- requeued between the first lock and the run's is cancelled too, unless a delivery
-- holds it now (its commit then finds the run cancelled and keeps it so). A cancelled
-- run's frontier stops: nothing more is planned for it. Returns each run cancelled
-- (as it is now) with the number of its chunks cancelled.
CREATE OR REPLACE FUNCTION cleanup_runs_cancelled_v1(ids uuid[], at timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    held bigint[];
    run cleanup_run;
    counted integer;
    late integer;
    cancelled jsonb := '[]'::jsonb;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO held FROM (
        SELECT chunk.id FROM cleanup_chunk AS chunk
        WHERE chunk.run_id = ANY(ids) AND chunk.state IN ('planned', 'enqueued', 'retrying')
        ORDER BY chunk.id FOR UPDATE) AS locked;
    FOR run IN SELECT * FROM cleanup_run AS running
               WHERE running.id = ANY(ids) AND running.state = 'running'
               ORDER BY running.created_at, running.id FOR UPDATE LOOP
        UPDATE cleanup_chunk AS chunk SET state = 'cancelled'
        WHERE chunk.run_id = run.id AND chunk.id = ANY(held)
          AND chunk.state IN ('planned', 'enqueued', 'retrying');
        GET DIAGNOSTICS counted = ROW_COUNT;
        UPDATE cleanup_chunk AS chunk SET state = 'cancelled'
        WHERE chunk.id IN (SELECT other.id FROM cleanup_chunk AS other
                           WHERE other.run_id = run.id
                             AND other.state IN ('planned', 'enqueued', 'retrying')
                           ORDER BY other.id FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS late = ROW_COUNT;
        UPDATE cleanup_run AS ended
        SET state = 'cancelled', finished_at = at, planned_all = true, frontier = NULL
        WHERE ended.id = run.id RETURNING * INTO run;
        cancelled := cancelled || jsonb_build_array(jsonb_build_object(
            'run', to_jsonb(run), 'chunks', counted + late));
    END LOOP;
    RETURN cancelled;
END
$$;
