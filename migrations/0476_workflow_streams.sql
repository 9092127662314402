-- Migration 476: workflow streams.
-- The host platform numbers its migrations; this number is fixed.
-- Every table of the streams feature is created here; later features fill the ones they own.

-- One row per stream definition. The row is the stream's lock: appends, closes and holds take
-- SELECT ... FOR UPDATE on it, and it carries the running counters that make credit O(1).
CREATE TABLE wfs_streams (
    run_id              text        NOT NULL,
    stream_id           text        NOT NULL,
    pins                jsonb       NOT NULL,
    pins_digest         text        NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    created_by          text        NOT NULL,
    -- highest sequence ever appended (0 = empty)
    last_sequence       bigint      NOT NULL DEFAULT 0,
    -- total payload bytes ever appended (through last_sequence)
    appended_bytes      bigint      NOT NULL DEFAULT 0,
    -- lowest sequence still retained; last_sequence + 1 when everything was pruned
    earliest_sequence   bigint      NOT NULL DEFAULT 1,
    -- cumulative bytes through earliest_sequence - 1 (what pruning took away)
    pruned_bytes        bigint      NOT NULL DEFAULT 0,
    closed_at           timestamptz,
    closed_by           text,
    PRIMARY KEY (run_id, stream_id),
    CHECK (earliest_sequence >= 1 AND earliest_sequence <= last_sequence + 1)
);

CREATE TABLE wfs_records (
    run_id            text        NOT NULL,
    stream_id         text        NOT NULL,
    sequence          bigint      NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('inline', 'object')),
    content_type      text        NOT NULL,
    payload           bytea,
    size_bytes        bigint      NOT NULL,
    -- bytes of all records of the stream through this one: unread bytes are a subtraction
    cumulative_bytes  bigint      NOT NULL,
    object            jsonb,
    appended_at       timestamptz NOT NULL DEFAULT now(),
    appended_by       text        NOT NULL,
    PRIMARY KEY (run_id, stream_id, sequence),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE,
    CHECK ((kind = 'inline') = (payload IS NOT NULL)),
    CHECK ((kind = 'object') = (object IS NOT NULL))
);
CREATE INDEX wfs_records_appended_at ON wfs_records (run_id, stream_id, appended_at);

-- What an Idempotency-Key bought: a retry gets the original sequences back.
CREATE TABLE wfs_append_receipts (
    run_id           text        NOT NULL,
    stream_id        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    request_digest   text        NOT NULL,
    first_sequence   bigint      NOT NULL,
    last_sequence    bigint      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    created_by       text        NOT NULL,
    PRIMARY KEY (run_id, stream_id, idempotency_key),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);

-- A consumer id is global: it belongs to the first stream it acknowledged on.
CREATE TABLE wfs_consumers (
    consumer_id      text        PRIMARY KEY,
    run_id           text        NOT NULL,
    stream_id        text        NOT NULL,
    acked_sequence   bigint      NOT NULL CHECK (acked_sequence >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    updated_by       text        NOT NULL,
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);
-- min(acked_sequence) per stream is an index probe, not a scan
CREATE INDEX wfs_consumers_stream_ack ON wfs_consumers (run_id, stream_id, acked_sequence);

-- Holds stack: the stream is held while any hold is active.
CREATE TABLE wfs_legal_holds (
    run_id       text        NOT NULL,
    stream_id    text        NOT NULL,
    hold_id      text        NOT NULL,
    reason       text        NOT NULL,
    held_by      text        NOT NULL,
    held_at      timestamptz NOT NULL DEFAULT now(),
    released_by  text,
    released_at  timestamptz,
    PRIMARY KEY (run_id, stream_id, hold_id),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);
CREATE INDEX wfs_legal_holds_active ON wfs_legal_holds (run_id, stream_id) WHERE released_at IS NULL;

-- Large payloads: prepare -> upload -> commit (or abort / expiry).
CREATE TABLE wfs_object_intents (
    intent_id        uuid        PRIMARY KEY,
    run_id           text        NOT NULL,
    stream_id        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('prepared', 'uploaded', 'committed', 'aborted', 'expired')),
    region           text        NOT NULL,
    bucket           text        NOT NULL,
    object_key       text        NOT NULL,
    sha256           text        NOT NULL,
    size_bytes       bigint      NOT NULL,
    content_type     text        NOT NULL,
    schema_ref       text,
    authorization_receipt jsonb  NOT NULL,
    -- the SHA-256 checksum S3 must report for the uploaded object (set by the upload)
    s3_checksum      text,
    expires_at       timestamptz NOT NULL,
    committed_sequence bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, stream_id, idempotency_key),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);
CREATE INDEX wfs_object_intents_expiry ON wfs_object_intents (expires_at) WHERE state IN ('prepared', 'uploaded');

-- Input records and their delivery row commit in one transaction.
CREATE TABLE wfs_input_deliveries (
    run_id           text        NOT NULL,
    stream_id        text        NOT NULL,
    sequence         bigint      NOT NULL,
    event_id         text        NOT NULL UNIQUE,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, stream_id, sequence),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);
-- the dispatcher looks for each stream's head: its lowest undelivered row
CREATE INDEX wfs_input_deliveries_head ON wfs_input_deliveries (run_id, stream_id, sequence)
    WHERE state IN ('pending', 'failed');

-- Objects whose records were pruned (or whose stream was deleted) wait here for S3 deletion.
-- No foreign key: the outbox outlives the stream it came from.
CREATE TABLE wfs_deletion_outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           text        NOT NULL,
    stream_id        text        NOT NULL,
    region           text        NOT NULL,
    bucket           text        NOT NULL,
    object_key       text        NOT NULL,
    reason           text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    deleted_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX wfs_deletion_outbox_due ON wfs_deletion_outbox (next_attempt_at) WHERE deleted_at IS NULL;

-- Evidence that a subscriber saw a wake signal run ahead of what it had read (re-read from Postgres).
CREATE TABLE wfs_gap_evidence (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id             text        NOT NULL,
    stream_id          text        NOT NULL,
    expected_sequence  bigint      NOT NULL,
    observed_sequence  bigint      NOT NULL,
    detected_by        text        NOT NULL,
    detected_at        timestamptz NOT NULL DEFAULT now()
);

-- Leases held by workers (dispatcher, pruner, cleaners). A row per unit of work being held.
CREATE TABLE wfs_worker_claims (
    worker_kind     text        NOT NULL,
    claim_key       text        NOT NULL,
    holder          text        NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    renewed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_kind, claim_key)
);
CREATE INDEX wfs_worker_claims_expiry ON wfs_worker_claims (lease_expires_at);
