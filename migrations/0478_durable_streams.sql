-- Migration 478: the Durable Streams protocol surface (api/durable).
-- A stream created through that surface is an ordinary wfs_streams row (pins from the server's
-- template) plus one row here for what the protocol adds; streams without a row here are our own
-- streams, served in JSON mode. Everything is deleted with the stream.

CREATE TABLE wfs_durable_streams (
    run_id              text        NOT NULL,
    stream_id           text        NOT NULL,
    -- as the creator sent it; compared by media type, case-insensitively
    content_type        text        NOT NULL,
    -- Stream-TTL: expires ttl_seconds after the last read or write (accessed_at)
    ttl_seconds         bigint      CHECK (ttl_seconds >= 0),
    -- Stream-Expires-At: a fixed moment
    expires_at          timestamptz,
    accessed_at         timestamptz NOT NULL DEFAULT now(),
    -- the last Stream-Seq accepted; compared byte-wise, hence the C collation
    stream_seq          text COLLATE "C",
    -- the producer tuple whose append closed the stream: its retry is a duplicate, not a conflict
    closed_by_producer  text,
    closed_by_epoch     bigint,
    closed_by_seq       bigint,
    -- one of our own streams that the protocol needed a row for (a producer, Stream-Seq, close):
    -- still a JSON stream without a lifetime, and not the protocol's to delete
    adopted             boolean     NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, stream_id),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE,
    CHECK (ttl_seconds IS NULL OR expires_at IS NULL)
);
-- the expiry sweep looks only at streams that can expire
CREATE INDEX wfs_durable_streams_expiring ON wfs_durable_streams (run_id, stream_id)
    WHERE ttl_seconds IS NOT NULL OR expires_at IS NOT NULL;

-- Idempotent producers: decided and advanced under the stream row lock, in the append's transaction.
CREATE TABLE wfs_durable_producers (
    run_id       text        NOT NULL,
    stream_id    text        NOT NULL,
    producer_id  text        NOT NULL,
    epoch        bigint      NOT NULL CHECK (epoch >= 0),
    last_seq     bigint      NOT NULL CHECK (last_seq >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, stream_id, producer_id),
    FOREIGN KEY (run_id, stream_id) REFERENCES wfs_streams ON DELETE CASCADE
);
