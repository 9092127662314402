-- append.sql plus the wake the server sends inside the transaction (pg_notify before COMMIT): NOTIFY
-- takes one cluster-wide lock in PreCommit_Notify and holds it through the commit's WAL flush.
\set s random(0, :streams - 1)
BEGIN;
SELECT stream_key AS key, last_sequence + 1 AS seq, appended_bytes + 100 AS cum FROM wfs_streams
  WHERE run_id = 'pgbench' AND stream_id = 'bench-' || :s FOR UPDATE \gset
SELECT min(acked_sequence) FROM wfs_consumers WHERE run_id = 'pgbench' AND stream_id = 'bench-' || :s;
INSERT INTO wfs_records (stream_key, sequence, cumulative_bytes, appended_at, content_type, appended_by, payload)
  VALUES (:key, :seq, :cum, clock_timestamp(), NULL, NULL,
          convert_to('"' || repeat('x', 98) || '"', 'UTF8'));
UPDATE wfs_streams SET last_sequence = :seq, appended_bytes = :cum
  WHERE run_id = 'pgbench' AND stream_id = 'bench-' || :s;
SELECT pg_notify('wfs_bench', 'pgbench/bench-' || :s || '/' || :seq || '/' || :seq);
COMMIT;
