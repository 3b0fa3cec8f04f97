-- The window, as the database's own functions: a run's latest chunks' pace, a run
-- locked for planning, the top-up opened under the policy's planning lock, the chunks
-- the engine planned written with the run's planning, and a run settled from its
-- chunks. What the next chunk is (its size, its range or items) is the engine's Python
-- (cleanup.engine.sizing, cleanup.engine.planning): it reads the policy's own queryset.
-- cleanup.engine.transitions is their only caller.
--
-- Versioned as delivery_v1.sql is.

-- The pace of the run's latest ``latest`` done chunks, newest first, for its next
-- chunk's size and span (cleanup.engine.sizing, cleanup.engine.planning): each one's
-- planned rows (and whether they were estimated), the rows it changed or found locked,
-- its time and wait for a CPU, and a range chunk's ids (an items chunk's message is
-- large and has none).
CREATE OR REPLACE FUNCTION cleanup_run_latest_v1(of_run uuid, latest integer)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'planned_rows', chunk.planned_rows, 'duration_ms', chunk.duration_ms,
                   'cpu_wait_ms', chunk.cpu_wait_ms, 'rows_estimated', chunk.rows_estimated,
                   'changed', chunk.rows_deleted + chunk.rows_updated + chunk.rows_locked,
                   'message__start_id', CASE WHEN items THEN NULL
                                        ELSE chunk.message -> 'start_id' END,
                   'message__end_id', CASE WHEN items THEN NULL
                                      ELSE chunk.message -> 'end_id' END)
                   ORDER BY chunk.committed_at DESC), '[]'::jsonb)
        FROM (SELECT run.scheme = 'items' AS items FROM cleanup_run AS run
              WHERE run.id = of_run) AS run,
             (SELECT * FROM cleanup_chunk AS done
              WHERE done.run_id = of_run AND done.state IN ('committed', 'acknowledged')
                AND done.duration_ms IS NOT NULL AND done.planned_rows > 0
              ORDER BY done.committed_at DESC LIMIT latest) AS chunk);
END
$$;

-- A run locked for planning its next chunks, read after the lock was granted (a cancel
-- that committed meanwhile is seen), with its latest chunks' pace (``latest_chunks``).
CREATE OR REPLACE FUNCTION cleanup_run_lock_v1(of_run uuid, latest integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    locked jsonb;
BEGIN
    SELECT to_jsonb(run) INTO locked FROM cleanup_run AS run WHERE run.id = of_run FOR UPDATE;
    IF locked IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN locked || jsonb_build_object('latest_chunks', cleanup_run_latest_v1(of_run, latest));
END
$$;

-- The window's top-up opens, under the policy's planning lock (the transaction's, so no
-- two chunks ending at once plan the same range or overfill the window): the policy's
-- running runs that still plan, oldest first; its chunks in flight; whether a halt of it
-- is open; and, where the window has room and no halt is open, the oldest of those runs
-- locked and read after its lock was granted, with the pace of its latest ``latest``
-- done chunks (for its next chunk's size; a range chunk's span with it). Each statement
-- reads what committed before it began: a run cancelled or a chunk ended while this one
-- waited for a lock is seen. A lock wait past the transaction's bound ends the top-up
-- (its ``error``) and not the transaction: the outcome before it commits, and a later
-- chunk's end or the reconciler tops the window up.
CREATE OR REPLACE FUNCTION cleanup_top_up_open_v1(
    of_policy text, window_size integer, latest integer, lock_ms integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    runs jsonb;
    flying integer;
    halted boolean;
    locked jsonb;
BEGIN
    -- The top-up's lock waits are bounded as the transaction's are (``lock_ms``), not as
    -- the chunk's statement's wait for learners' rows was, which is far shorter: two
    -- chunks ending at once wait for each other's planning, and that is no failure.
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
    PERFORM pg_advisory_xact_lock(hashtextextended('cleanup:' || of_policy, 0));
    SELECT coalesce(jsonb_agg(run.id ORDER BY run.created_at, run.id), '[]'::jsonb) INTO runs
    FROM cleanup_run AS run
    WHERE run.policy = of_policy AND run.state = 'running' AND NOT run.planned_all;
    IF runs = '[]'::jsonb THEN
        RETURN jsonb_build_object('runs', runs);
    END IF;
    SELECT count(*) INTO flying
    FROM cleanup_chunk AS chunk JOIN cleanup_run AS run ON run.id = chunk.run_id
    WHERE run.policy = of_policy AND run.state = 'running'
      AND chunk.state IN ('planned', 'enqueued', 'retrying');
    halted := EXISTS (SELECT FROM cleanup_halt AS halt
                      WHERE halt.policy = of_policy AND halt.ended_at IS NULL);
    IF NOT halted AND flying < window_size THEN
        locked := cleanup_run_lock_v1((runs ->> 0)::uuid, latest);
    END IF;
    RETURN jsonb_build_object('runs', runs, 'flying', flying, 'halted', halted,
                              'locked', locked);
EXCEPTION WHEN lock_not_available OR query_canceled THEN
    RETURN jsonb_build_object('error', SQLERRM);
END
$$;

-- Bring a run's state in line with its chunks: running while it still plans or any
-- chunk is unfinished, then completed, or completed with dead letters; a cancelled run
-- stays cancelled. The run's row lock serialises the last chunks of a run: one
-- committing at the same moment waits here, and its own settling then sees this one.
-- Returns the run as it is now, and whether its state changed; null if it is gone.
CREATE OR REPLACE FUNCTION cleanup_run_settle_v1(of_run uuid, at timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    run cleanup_run;
    settled text;
BEGIN
    SELECT * INTO run FROM cleanup_run WHERE id = of_run FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF run.state = 'cancelled' THEN
        RETURN jsonb_build_object('run', to_jsonb(run), 'changed', false);
    END IF;
    settled := CASE
        WHEN NOT run.planned_all OR EXISTS (
            SELECT FROM cleanup_chunk AS chunk WHERE chunk.run_id = of_run
              AND chunk.state IN ('planned', 'enqueued', 'retrying')) THEN 'running'
        WHEN EXISTS (SELECT FROM cleanup_chunk AS chunk WHERE chunk.run_id = of_run
                       AND chunk.state = 'dead_lettered') THEN 'completed_with_dead_letters'
        ELSE 'completed' END;
    IF settled = run.state THEN
        RETURN jsonb_build_object('run', to_jsonb(run), 'changed', false);
    END IF;
    UPDATE cleanup_run SET state = settled,
        finished_at = CASE WHEN settled = 'running' THEN NULL ELSE at END
    WHERE id = of_run RETURNING * INTO run;
    RETURN jsonb_build_object('run', to_jsonb(run), 'changed', true);
END
$$;

-- The chunks the engine planned for a run it holds locked, written (``chunks``: each
-- one's id in the run, state, message, planned rows and whether they are estimated),
-- their messages queued where django-q2's ORM broker keeps its queue in this database
-- (``queue``: each row's key, signed payload and lock, as the broker writes them), with
-- how far the run's planning got (``planning``: its frontier, whether it planned all,
-- its candidates, chunks and messages so far, its next chunk's size and span; any
-- planning error cleared), and the run settled once it planned all. A chunk and its
-- message so appear together, with the commit of the transaction that planned it.
-- Returns each chunk's row id by its id in the run and the queue rows' ids in order; or
-- the ``error`` that stopped the writes, none of which is then kept, the transaction
-- going on (the run's planning is tried again later).
CREATE OR REPLACE FUNCTION cleanup_run_planned_v1(
    of_run uuid, chunks jsonb, planning jsonb, queue jsonb, at timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    ids jsonb;
    queued jsonb;
BEGIN
    WITH added AS (
        INSERT INTO cleanup_chunk (
            run_id, chunk_id, state, message, planned_rows, rows_estimated, planned_at,
            enqueued_at, deliveries, deliveries_completed, noop_deliveries, failures,
            dead_letters, unfinished_forgiven, transient_retries, rows_deleted,
            rows_updated, items_skipped, rows_locked, reconciles, last_error, cause,
            verdict, received_message, failure_class, discard_reason, history)
        SELECT of_run, (planned ->> 'chunk_id')::integer, planned ->> 'state',
               planned -> 'message', (planned ->> 'planned_rows')::integer,
               coalesce((planned ->> 'rows_estimated')::boolean, false), at,
               CASE WHEN planned ->> 'state' = 'enqueued' THEN at END,
               0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '', '', '', '', '', '', '[]'::jsonb
        FROM jsonb_array_elements(chunks) AS planned
        RETURNING id, chunk_id)
    SELECT coalesce(jsonb_object_agg(chunk_id, id), '{}'::jsonb) INTO ids FROM added;
    UPDATE cleanup_run
    SET frontier = nullif(planning -> 'frontier', 'null'::jsonb),
        planned_all = (planning ->> 'planned_all')::boolean,
        candidates = (planning ->> 'candidates')::integer,
        chunks_planned = (planning ->> 'chunks_planned')::integer,
        next_chunk_size = (planning ->> 'next_chunk_size')::integer,
        max_span = (planning ->> 'max_span')::bigint,
        messages_sent = (planning ->> 'messages_sent')::integer,
        planning_error = ''
    WHERE id = of_run;
    WITH added AS (
        INSERT INTO django_q_ormq (key, payload, lock)
        SELECT message ->> 'key', message ->> 'payload', (message ->> 'lock')::timestamptz
        FROM jsonb_array_elements(queue) WITH ORDINALITY AS sent(message, n) ORDER BY n
        RETURNING id)
    SELECT coalesce(jsonb_agg(id ORDER BY id), '[]'::jsonb) INTO queued FROM added;
    IF (planning ->> 'planned_all')::boolean THEN
        PERFORM cleanup_run_settle_v1(of_run, at);
    END IF;
    RETURN jsonb_build_object('ids', ids, 'queue', queued);
EXCEPTION WHEN OTHERS THEN
    RETURN jsonb_build_object('error', SQLERRM, 'sqlstate', SQLSTATE);
END
$$;
