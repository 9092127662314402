-- Migration 479: background work in proportion to what is due (issue 14).
--
-- Retention used to visit the first thousand streams with a retention pin on every sweep (and never
-- the rest). A stream now says itself when it is next due for pruning, and the pruner reads only the
-- due ones through a partial index.

-- The retention pins as columns, so the append statement and the sweep read two integers instead of
-- the pins document. Pins are immutable; an UPDATE that does not touch pins does not recompute these.
ALTER TABLE wfs_streams
    ADD COLUMN retention_max_records bigint
        GENERATED ALWAYS AS ((pins->'retention'->>'max_records')::bigint) STORED,
    ADD COLUMN retention_max_age_seconds bigint
        GENERATED ALWAYS AS ((pins->'retention'->>'max_age_seconds')::bigint) STORED,
    -- When the stream is next due for pruning; NULL: nothing to prune (no retention pin, or no record).
    -- Kept by the append statement (least of itself, "now" once past max_records, and "now + max_age"
    -- — early is harmless, late is not), by the pruner (exact, from the oldest record left) and by a
    -- hold's release (the trigger below). A held stream is parked an hour ahead, not scanned per sweep.
    ADD COLUMN next_prune_at timestamptz;

-- The sweep's only way in: due streams in due order; streams with nothing due are not in the index.
CREATE INDEX wfs_streams_prune_due ON wfs_streams (next_prune_at) WHERE next_prune_at IS NOT NULL;

-- Backfill: exact due time for every stream that holds records and pins a retention.
UPDATE wfs_streams s
SET next_prune_at = CASE
        WHEN s.last_sequence - s.earliest_sequence >= s.retention_max_records THEN now()
        ELSE (SELECT r.appended_at FROM wfs_records r
              WHERE r.run_id = s.run_id AND r.stream_id = s.stream_id AND r.sequence = s.earliest_sequence)
             + make_interval(secs => s.retention_max_age_seconds)
    END
WHERE s.last_sequence >= s.earliest_sequence
  AND (s.retention_max_records IS NOT NULL OR s.retention_max_age_seconds IS NOT NULL);

-- Only the pruner used this index (oldest record past max_age). appended_at ascends with the sequence
-- (it is taken under the stream's row lock), so the pruner walks the primary key instead, and every
-- record is ~40 bytes smaller on disk.
DROP INDEX IF EXISTS wfs_records_appended_at;

-- THE active-hold predicate: a stream is held while any of its holds is unreleased. Retention, the
-- object janitor and stream state/deletion all ask this view, so the rule lives in one place.
CREATE VIEW wfs_active_holds (run_id, stream_id) AS
    SELECT DISTINCT run_id, stream_id FROM wfs_legal_holds WHERE released_at IS NULL;

-- The deletion outbox by stream (a hold's release wakes the stream's parked deletions; a stream's
-- objects are listed by stream).
CREATE INDEX wfs_deletion_outbox_stream ON wfs_deletion_outbox (run_id, stream_id) WHERE deleted_at IS NULL;

-- A released hold makes the stream due again, and its parked object deletions too: held work is
-- parked rather than rescanned, so the release is what brings it back without waiting for the park.
CREATE FUNCTION wfs_hold_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE wfs_streams SET next_prune_at = now()
    WHERE run_id = NEW.run_id AND stream_id = NEW.stream_id
      AND last_sequence >= earliest_sequence
      AND (retention_max_records IS NOT NULL OR retention_max_age_seconds IS NOT NULL);
    UPDATE wfs_deletion_outbox SET next_attempt_at = now()
    WHERE run_id = NEW.run_id AND stream_id = NEW.stream_id AND deleted_at IS NULL AND next_attempt_at > now();
    RETURN NULL;
END
$$;

CREATE TRIGGER wfs_hold_released AFTER UPDATE OF released_at ON wfs_legal_holds
    FOR EACH ROW WHEN (OLD.released_at IS NULL AND NEW.released_at IS NOT NULL)
    EXECUTE FUNCTION wfs_hold_released();
