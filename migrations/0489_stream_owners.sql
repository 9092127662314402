-- Tenancy (domain/ownership.py): a stream defined through Kubernetes records the WorkflowStream object
-- that owns it; one defined over HTTP has none. A run belongs to the namespace whose objects define its
-- streams, which the index below answers per run.
ALTER TABLE wfs_streams
    ADD COLUMN owner_namespace text,
    ADD COLUMN owner_name text,
    ADD COLUMN owner_uid text,
    ADD CONSTRAINT wfs_streams_owner CHECK (
        (owner_uid IS NULL) = (owner_namespace IS NULL) AND (owner_uid IS NULL) = (owner_name IS NULL)
    );
CREATE INDEX wfs_streams_run_owner ON wfs_streams (run_id, owner_namespace) WHERE owner_namespace IS NOT NULL;

-- Who may see each stream (domain.authz.seen_by: every subject of the actions that let a principal see it),
-- so listings select what a caller may see (seen_by && the caller's subjects) instead of reading every
-- row's pins in Python. Pins are immutable: store.definitions writes it with the row, once. A plain
-- column, not a generated one: Postgres recomputes stored generated columns on every UPDATE, and every
-- append updates its stream's row.
ALTER TABLE wfs_streams ADD COLUMN seen_by text[] NOT NULL DEFAULT '{}';

-- The same rule over a stored pins document, for the rows stored before this migration (an unset delete
-- is the close subjects, which are counted anyway; subscribe alone does not let one see);
-- tests/test_stream_lifecycle.py holds it and the domain's writing to the same answers.
CREATE FUNCTION wfs_seen_by(pins jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(
    SELECT DISTINCT subject
    FROM jsonb_each(pins -> 'authorization') AS a(action, subjects)
    CROSS JOIN LATERAL jsonb_array_elements_text(
        CASE WHEN jsonb_typeof(a.subjects) = 'array' THEN a.subjects ELSE '[]'::jsonb END
    ) AS subject
    WHERE a.action IN ('append', 'read', 'ack', 'close', 'legal_hold', 'delete')
    ORDER BY subject
);
UPDATE wfs_streams SET seen_by = wfs_seen_by(pins);
CREATE INDEX wfs_streams_seen_by ON wfs_streams USING gin (seen_by);
