-- Migration 482: a narrow record row (issue 14: at most 250 bytes on disk per 100-byte record, indexes
-- included; the 0476 row measured 318: heap 234, primary key 84).
--
-- What the 0476 row spent beyond its payload, per record:
-- - run_id and stream_id as text in the heap row and again in the primary key (~20 bytes each time for
--   short names, more for real ones): now one bigint, the stream's surrogate key;
-- - kind as text ('inline'/'object', 7 bytes), which is exactly "object IS NULL": dropped;
-- - size_bytes (8 bytes), which is octet_length(payload) or the object document's size: dropped;
-- - 11 columns: past 8, the null bitmap no longer fits the 23-byte tuple header, which grows by 8.
-- The new row has 8 columns, fixed-width ones first (no alignment padding between them):
--   header 24 + 4 x 8 fixed + content_type, appended_by, payload, object (varlena, 1-byte headers).
-- Readers get kind and size_bytes computed in SQL (store/reads.py: RECORD_COLUMNS), so a stored record
-- reads back exactly as before.
--
-- Cost on a big table: wfs_streams is rewritten once (a new identity column fills every row), and every
-- record is copied once into the new table in key order, then its primary key is built in one sort and
-- the foreign key validated in one join. All of it under ACCESS EXCLUSIVE locks, in the migration's one
-- transaction: appends and reads wait for it, and the old and new tables coexist on disk until COMMIT.
-- Expect about what a bulk load of the same records costs (not measured here: the benchmark loads the
-- new schema); on a large production table run it in a maintenance window, or copy ahead of time into
-- a shadow table fed by a trigger.

-- The stream's surrogate key: 8 bytes in every record row and index entry instead of two texts.
ALTER TABLE wfs_streams ADD COLUMN stream_key bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE wfs_streams ADD CONSTRAINT wfs_streams_stream_key UNIQUE (stream_key);

ALTER TABLE wfs_records RENAME TO wfs_records_0476;
ALTER INDEX wfs_records_pkey RENAME TO wfs_records_0476_pkey;

CREATE TABLE wfs_records (
    stream_key        bigint      NOT NULL,
    sequence          bigint      NOT NULL,
    -- bytes of all records of the stream through this one: unread bytes are a subtraction
    cumulative_bytes  bigint      NOT NULL,
    appended_at       timestamptz NOT NULL DEFAULT now(),
    content_type      text        NOT NULL,
    appended_by       text        NOT NULL,
    -- an inline record's bytes, or an object record's metadata (region, bucket, key, size, digest)
    payload           bytea,
    object            jsonb,
    CHECK ((payload IS NULL) <> (object IS NULL))
);

INSERT INTO wfs_records (stream_key, sequence, cumulative_bytes, appended_at, content_type, appended_by, payload, object)
SELECT s.stream_key, r.sequence, r.cumulative_bytes, r.appended_at, r.content_type, r.appended_by, r.payload, r.object
FROM wfs_records_0476 r
JOIN wfs_streams s USING (run_id, stream_id)
ORDER BY s.stream_key, r.sequence;

-- built after the copy: one sort instead of a page split per stream's run of records
ALTER TABLE wfs_records ADD CONSTRAINT wfs_records_pkey PRIMARY KEY (stream_key, sequence);
ALTER TABLE wfs_records ADD CONSTRAINT wfs_records_stream_key_fkey
    FOREIGN KEY (stream_key) REFERENCES wfs_streams (stream_key) ON DELETE CASCADE;

DROP TABLE wfs_records_0476;

-- The table is a queue per stream: appended at the tail, pruned at the head. At autovacuum's default
-- threshold (20 % of the rows dead) a fifth of it is dead space before vacuum makes it reusable, and the
-- table is sized for that; at 2 % the steady state stays near the packed size. Vacuum then runs ten
-- times as often, each run visiting the pages pruned since the last (bench/scale measures the figure
-- in steady state: bench/README.md).
ALTER TABLE wfs_records SET (autovacuum_vacuum_scale_factor = 0.02);
