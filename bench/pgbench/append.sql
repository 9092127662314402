-- Our append transaction for one 100-byte JSON record, as the server runs it (store/appends.py):
-- lock the stream row (which carries the surrogate key records are stored under, migration 482), read
-- the consumers' low-water mark (credit), insert the record (its default content type and the stream's
-- creator as NULL, migration 483), bump the stream's counters. Streams are
-- run 'pgbench', stream 'bench-{0..streams-1}' (pgbench -D streams=N).
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
COMMIT;
