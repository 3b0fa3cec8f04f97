-- A chunk's delivery, as the database's own functions: its start, the lock and check
-- that open its transaction, and how the delivery ends (committed, a no-op for a chunk
-- that had finished, left for redelivery, dead-lettered). The worker's transaction is a
-- few calls around its one ORM statement (docs/design.md, *A chunk in three calls*);
-- cleanup.engine.transitions is their only caller. The window's functions, which the
-- end of a chunk calls next, are in window_v1.sql.
--
-- Versioned: a change of what a function takes or does comes as a new name (``_v2``)
-- from a new file and migration, beside this one, so workers of the release before and
-- after run side by side during a deploy.

-- ``history`` with ``entry`` appended; once it holds ``keep`` entries, its first is
-- dropped, so a chunk delivered again and again keeps a bounded row. A value that is no
-- array (a hand edit: an object, a scalar, null) counts as an empty one.
CREATE OR REPLACE FUNCTION cleanup_history_add_v1(history jsonb, entry jsonb, keep integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(history) IS DISTINCT FROM 'array' THEN
        RETURN jsonb_build_array(entry);
    END IF;
    IF jsonb_array_length(history) >= keep THEN
        history := history - 0;
    END IF;
    RETURN history || jsonb_build_array(entry);
END
$$;

-- ``history`` with ``patch`` merged into its entries numbered ``n``: the delivery
-- ended. Other entries, an entry that is no object, and their order are kept as they
-- are; a value that is no array counts as an empty one.
CREATE OR REPLACE FUNCTION cleanup_history_end_v1(history jsonb, n integer, patch jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF n IS NULL THEN
        RETURN history;
    END IF;
    IF jsonb_typeof(history) IS DISTINCT FROM 'array' THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN (SELECT coalesce(jsonb_agg(CASE
                WHEN jsonb_typeof(element) = 'object' AND element ->> 'n' = n::text
                THEN element || patch ELSE element END ORDER BY position), '[]'::jsonb)
            FROM jsonb_array_elements(history) WITH ORDINALITY AS entries(element, position));
END
$$;

-- How a delivery ended, as its history entry says it: when, how, and what it changed,
-- skipped, retried or met (each left out when there is nothing to say).
CREATE OR REPLACE FUNCTION cleanup_delivery_end_v1(
    at timestamptz, outcome text, changed integer DEFAULT 0, locked integer DEFAULT 0,
    retries integer DEFAULT 0, error text DEFAULT '')
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    patch jsonb := jsonb_build_object('ended_at', at, 'outcome', outcome);
BEGIN
    IF changed <> 0 THEN patch := patch || jsonb_build_object('rows', changed); END IF;
    IF locked <> 0 THEN patch := patch || jsonb_build_object('locked', locked); END IF;
    IF retries <> 0 THEN patch := patch || jsonb_build_object('retries', retries); END IF;
    IF error <> '' THEN patch := patch || jsonb_build_object('error', error); END IF;
    RETURN patch;
END
$$;

-- A delivery starts: the chunk ``chunk_no`` of run ``of_run`` is locked (waiting at most
-- ``lock_ms``), its delivery counted and entered in its history (ended at once if the
-- chunk is dead-lettered: it is not applied). Called alone, the statement is its own
-- transaction, committed without waiting for its flush: a trace any later commit's
-- flush makes durable (docs/design.md, *A delivery's start*). Returns the chunk and its
-- run as they were before the count, and the delivery's number; null if the run has no
-- such chunk.
CREATE OR REPLACE FUNCTION cleanup_delivery_start_v1(
    of_run uuid, chunk_no integer, worker text, received_at timestamptz,
    at timestamptz, lock_ms integer, keep integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    chunk cleanup_chunk;
    entry jsonb;
BEGIN
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true),
            set_config('synchronous_commit', 'off', true);
    SELECT * INTO chunk FROM cleanup_chunk
    WHERE run_id = of_run AND chunk_id = chunk_no FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    entry := jsonb_build_object('n', chunk.deliveries + 1, 'at', coalesce(received_at, at),
                                'worker', worker);
    IF chunk.state = 'dead_lettered' THEN
        entry := entry || jsonb_build_object('ended_at', entry -> 'at',
                                             'outcome', 'not applied: the chunk is dead-lettered');
    END IF;
    UPDATE cleanup_chunk
    SET deliveries = deliveries + 1,
        history = cleanup_history_add_v1(history, entry, keep),
        last_delivery_at = coalesce(received_at, last_delivery_at)
    WHERE id = chunk.id;
    RETURN jsonb_build_object(
        'chunk', to_jsonb(chunk),
        'run', (SELECT to_jsonb(run) FROM cleanup_run AS run WHERE run.id = of_run),
        'delivery', chunk.deliveries + 1);
END
$$;

-- A chunk's transaction opens: bounded (a lock wait, a statement, time idle in it) and
-- named for the chunk (the lock-waits indicator and the events its rows cause read the
-- name), then the chunk locked and its run read after the lock was granted, in a
-- statement of its own, so a cancel that committed during the wait is seen: the chunk of
-- a cancelled run is cancelled, and nothing more is deleted. ``row_lock_ms``, where the
-- chunk's statement may wait for learners' rows, bounds the waits that follow.
-- Returns the chunk's state and planned rows; no row if the chunk is gone.
CREATE OR REPLACE FUNCTION cleanup_chunk_begin_v1(
    of_chunk bigint, lock_ms integer, statement_ms integer, idle_ms integer,
    application text, source text, run_label text, chunk_label text,
    asynchronous boolean, row_lock_ms integer)
RETURNS TABLE (state text, planned_rows integer) LANGUAGE plpgsql AS $$
DECLARE
    chunk_state text;
    chunk_rows integer;
    of_run uuid;
BEGIN
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true),
            set_config('statement_timeout', statement_ms || 'ms', true),
            set_config('idle_in_transaction_session_timeout', idle_ms || 'ms', true),
            set_config('application_name', application, true),
            set_config('cleanup.source', source, true),
            set_config('cleanup.run_id', run_label, true),
            set_config('cleanup.chunk_id', chunk_label, true),
            set_config('synchronous_commit', CASE WHEN asynchronous THEN 'off'
                       ELSE current_setting('synchronous_commit') END, true);
    SELECT chunk.state, chunk.planned_rows, chunk.run_id INTO chunk_state, chunk_rows, of_run
    FROM cleanup_chunk AS chunk WHERE chunk.id = of_chunk FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF chunk_state IN ('planned', 'enqueued', 'retrying')
            AND (SELECT run.state FROM cleanup_run AS run WHERE run.id = of_run) = 'cancelled' THEN
        UPDATE cleanup_chunk SET state = 'cancelled' WHERE id = of_chunk;
        chunk_state := 'cancelled';
    END IF;
    IF row_lock_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', least(row_lock_ms, lock_ms) || 'ms', true);
    END IF;
    RETURN QUERY SELECT chunk_state, chunk_rows;
END
$$;

-- unfinished -> committed, with the delivery's outcome, in the transaction of the
-- chunk's statement: its rows changed and skipped, its time (``duration_ms``, of which
-- ``cpu_wait_ms`` its worker waited for a CPU, never more than the whole), the retries it
-- took. False if the chunk had finished: a committed chunk is never committed twice.
CREATE OR REPLACE FUNCTION cleanup_chunk_committed_v1(
    of_chunk bigint, delivery integer, deleted integer, updated integer, locked integer,
    retries integer, duration_ms integer, cpu_wait_ms integer, at timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_chunk AS chunk
    SET duration_ms = cleanup_chunk_committed_v1.duration_ms,
        -- (least() would take a missing reading for the whole.)
        cpu_wait_ms = CASE WHEN cleanup_chunk_committed_v1.cpu_wait_ms IS NOT NULL
                      THEN least(cleanup_chunk_committed_v1.cpu_wait_ms,
                                 cleanup_chunk_committed_v1.duration_ms) END,
        state = 'committed',
        committed_at = at,
        rows_deleted = chunk.rows_deleted + deleted,
        rows_updated = chunk.rows_updated + updated,
        -- (Estimated planned rows say nothing of what was skipped.)
        items_skipped = chunk.items_skipped + CASE WHEN chunk.rows_estimated THEN 0
            ELSE greatest(chunk.planned_rows - deleted - updated - locked, 0) END,
        rows_locked = chunk.rows_locked + locked,
        deliveries_completed = chunk.deliveries_completed + 1,
        noop_deliveries = chunk.noop_deliveries
                          + CASE WHEN deleted + updated = 0 THEN 1 ELSE 0 END,
        transient_retries = chunk.transient_retries + retries,
        history = cleanup_history_end_v1(chunk.history, delivery, cleanup_delivery_end_v1(
            at, 'committed', deleted + updated, locked, retries))
    WHERE chunk.id = of_chunk AND chunk.state IN ('planned', 'enqueued', 'retrying');
    RETURN FOUND;
END
$$;

-- A delivery of a chunk that had finished (``already``, its state): completed, and it
-- changed nothing.
CREATE OR REPLACE FUNCTION cleanup_chunk_noop_v1(
    of_chunk bigint, delivery integer, retries integer, already text, at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_chunk AS chunk
    SET deliveries_completed = chunk.deliveries_completed + 1,
        noop_deliveries = chunk.noop_deliveries + 1,
        transient_retries = chunk.transient_retries + retries,
        history = cleanup_history_end_v1(chunk.history, delivery, cleanup_delivery_end_v1(
            at, 'no-op: already ' || already, 0, 0, retries))
    WHERE chunk.id = of_chunk;
END
$$;

-- unfinished -> retrying: the delivery failed transiently (``error``, whose first line
-- is its ``cause``) and is left for redelivery. False if the chunk had finished.
CREATE OR REPLACE FUNCTION cleanup_chunk_retrying_v1(
    of_chunk bigint, delivery integer, error text, cause text, retries integer,
    at timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cleanup_chunk AS chunk
    SET state = 'retrying',
        failure_class = 'transient',
        failures = chunk.failures + 1,
        transient_retries = chunk.transient_retries + retries,
        last_error = error,
        cause = cleanup_chunk_retrying_v1.cause,
        history = cleanup_history_end_v1(chunk.history, delivery, cleanup_delivery_end_v1(
            at, 'left for redelivery', 0, 0, retries, cleanup_chunk_retrying_v1.cause))
    WHERE chunk.id = of_chunk AND chunk.state IN ('planned', 'enqueued', 'retrying');
    RETURN FOUND;
END
$$;

-- unfinished -> dead_lettered with the class of its failure and why (``reason``, whose
-- first line is ``cause``), and the message the delivery carried where it differs from
-- the one sent (``received``, else empty). A verdict of deliveries that kept dying
-- (class 'poison' or 'transient') is kept apart: the last real error the deliveries met
-- stays the chunk's error and cause beside it. False if the chunk had finished: a
-- committed chunk is never dead-lettered.
CREATE OR REPLACE FUNCTION cleanup_chunk_dead_lettered_v1(
    of_chunk bigint, delivery integer, reason text, cause text, failure_class text,
    received text, at timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    kept_dying boolean := failure_class IN ('poison', 'transient');
BEGIN
    UPDATE cleanup_chunk AS chunk
    SET state = 'dead_lettered',
        dead_lettered_at = at,
        failure_class = cleanup_chunk_dead_lettered_v1.failure_class,
        verdict = CASE WHEN kept_dying THEN reason ELSE '' END,
        last_error = CASE WHEN kept_dying THEN chunk.last_error ELSE reason END,
        cause = CASE WHEN kept_dying THEN chunk.cause ELSE cleanup_chunk_dead_lettered_v1.cause END,
        dead_letters = chunk.dead_letters + 1,
        received_message = CASE WHEN received <> '' THEN received
                           ELSE chunk.received_message END,
        history = cleanup_history_end_v1(chunk.history, delivery, cleanup_delivery_end_v1(
            at, 'dead-lettered (' || cleanup_chunk_dead_lettered_v1.failure_class || ')',
            0, 0, 0, cleanup_chunk_dead_lettered_v1.cause))
    WHERE chunk.id = of_chunk AND chunk.state IN ('planned', 'enqueued', 'retrying');
    RETURN FOUND;
END
$$;
