-- Migration 484: records no longer reference their stream through a foreign key (issue 13: appends
-- at the speed of Postgres).
--
-- The key checked every inserted record: Postgres runs its referential-integrity trigger once per row,
-- a query that finds and share-locks the stream row the append already holds FOR UPDATE. pgbench running
-- our append transaction (bench/pgbench/append.sql, 1,000 streams, 32 clients, 12 s, alternating, three
-- rounds each): 3,715-3,785 tps with the key, 3,888-3,916 without, every round above every round with it
-- (CPU per transaction 507-519 -> 491-494 us). In the benchmark's batched appends, Postgres' user CPU per
-- append went from 58 to 50 us at 1,000 streams x 32 connections and from 39 to 33 at 1 x 32. The key
-- bought nothing the code does not already hold:
-- - a record is only written by store.appends.append_batch, in the transaction that locked its stream
--   row (a record for a missing stream cannot be written);
-- - a stream row is only deleted by store.definitions.delete_stream, which deletes the stream's records
--   in the same statement (what ON DELETE CASCADE did; tests/test_definitions.py checks it).
--
-- Cost on a big table: none (a catalog change; no row is read or rewritten).
ALTER TABLE wfs_records DROP CONSTRAINT wfs_records_stream_key_fkey;

COMMENT ON TABLE wfs_records IS
    'Written only by store.appends (under the stream row lock); deleted with their stream by store.definitions.delete_stream, and by retention';
