-- The streams append.sql writes to: run 'pgbench', streams 'bench-0' .. 'bench-{streams-1}'
-- (psql -v streams=N). Pins are not read by the transaction, so they are left empty.
-- records hold no foreign key to their stream (migration 484): they go first
DELETE FROM wfs_records WHERE stream_key IN (SELECT stream_key FROM wfs_streams WHERE run_id = 'pgbench');
DELETE FROM wfs_streams WHERE run_id = 'pgbench';
INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by)
  SELECT 'pgbench', 'bench-' || i, '{}'::jsonb, 'pgbench', 'bench' FROM generate_series(0, :streams - 1) AS i;
