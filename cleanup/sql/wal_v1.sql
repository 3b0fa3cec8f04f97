-- The WAL a chunk's transaction wrote, where the server counts WAL for each session
-- (PostgreSQL 18: pg_stat_get_backend_wal). On an older server these functions do
-- nothing and say so (null): the figure is unknown there, never 0.
--
-- A session's counters reach shared memory when it goes idle, out of a transaction, at
-- most once a second unless told to at once (pg_stat_force_next_flush); inside a
-- transaction nothing of it is flushed. So the chunk's figure is read in three steps:
-- the delivery's start, a transaction of its own, has its WAL flushed as it ends; the
-- chunk's transaction reads its session's counter (``cleanup_wal_mark_v1``, as flushed
-- after the start) and has its own WAL flushed as it commits; a statement after the
-- commit reads the counter again and keeps the difference on the chunk
-- (``cleanup_chunk_wal_v1``). On a connection of its own the figure is exact. Behind a
-- transaction pooler a server connection serves other clients between a client's
-- transactions, and what they wrote and did not flush yet would be counted with the
-- chunk: the figure is kept only where the start, the chunk's transaction and the
-- reading ran on one session (docs/performance.md, *A chunk's WAL*).
--
-- Versioned like the ledger's functions (delivery_v1.sql).

-- This session's WAL so far, as last flushed, with its pid, and its next flush forced
-- (as it next goes idle); null where the server keeps no per-session WAL counters.
CREATE OR REPLACE FUNCTION cleanup_wal_mark_v1()
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('server_version_num')::integer < 180000 THEN
        RETURN NULL;
    END IF;
    PERFORM pg_stat_force_next_flush();
    RETURN (SELECT jsonb_build_object('pid', pg_backend_pid(), 'bytes', wal.wal_bytes)
            FROM pg_stat_get_backend_wal(pg_backend_pid()) AS wal);
END
$$;

-- The WAL written by the chunk ``of_chunk``'s transaction, kept on it once it committed
-- (a chunk commits once; a figure kept stays): the counter of the session ``committed``
-- names (the transaction's mark, as flushed before it) read again after its commit.
-- Null, and nothing kept, where it cannot be told: no marks, marks of two sessions
-- (``started``, the delivery's start's, is another), a reading from another session
-- than theirs (behind a transaction pooler the chunk's may be serving another client
-- now, whose WAL its counters would soon hold), a session gone, counters that went
-- back (reset, or a new session under the same pid). Its own write waits for a lock at
-- most ``lock_ms`` and does not wait for its flush: it is a figure, not an outcome.
CREATE OR REPLACE FUNCTION cleanup_chunk_wal_v1(
    of_chunk bigint, started jsonb, committed jsonb, lock_ms integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    written numeric;
BEGIN
    IF current_setting('server_version_num')::integer < 180000
            OR jsonb_typeof(started -> 'pid') IS DISTINCT FROM 'number'
            OR jsonb_typeof(committed -> 'pid') IS DISTINCT FROM 'number'
            OR jsonb_typeof(committed -> 'bytes') IS DISTINCT FROM 'number'
            OR started -> 'pid' <> committed -> 'pid'
            OR committed -> 'pid' <> to_jsonb(pg_backend_pid()) THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true),
            set_config('synchronous_commit', 'off', true);
    SELECT wal.wal_bytes - (committed ->> 'bytes')::numeric INTO written
    FROM pg_stat_get_backend_wal(pg_backend_pid()) AS wal;
    IF written IS NULL OR written < 0 OR written > 9e18 THEN
        RETURN NULL;
    END IF;
    UPDATE cleanup_chunk SET wal_bytes = written
    WHERE id = of_chunk AND committed_at IS NOT NULL AND wal_bytes IS NULL;
    RETURN written;
END
$$;

-- A chunk's WAL kept: added to its policy's totals (totals_v1.sql), at the commit.
CREATE OR REPLACE FUNCTION cleanup_count_chunk_wal_v1() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cleanup_total_add_v1(
        'policy', run.policy, jsonb_build_object('wal_bytes', NEW.wal_bytes, 'wal_chunks', 1))
    FROM cleanup_run AS run WHERE run.id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER cleanup_count_chunk_wal_v1 AFTER UPDATE OF wal_bytes ON cleanup_chunk
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.wal_bytes IS NULL AND NEW.wal_bytes IS NOT NULL)
    EXECUTE FUNCTION cleanup_count_chunk_wal_v1();
