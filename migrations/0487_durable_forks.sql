-- Migration 487: forks on the Durable Streams surface (store/durable.py, PROTOCOL.md's stream forking).
-- A fork is a stream of its own whose first records were copied from its source at the fork point
-- (copy-on-fork: reads of a fork never look at its source). Its row says where it came from, so that a
-- PUT repeating the fork is answered as the same stream, and its source counts its live forks: a source
-- deleted while forks remain is only marked deleted (410 to every request, its name still taken) and
-- goes when the last of its forks goes, which may free its own source in turn.
ALTER TABLE wfs_durable_streams
    ADD COLUMN forked_from_run      text,
    ADD COLUMN forked_from_stream   text,
    -- the exclusive cursor of the source the fork copied through, and how far into the next record
    -- (bytes of a byte stream's record, messages of a JSON stream)
    ADD COLUMN fork_offset          bigint,
    ADD COLUMN fork_sub_offset      bigint,
    -- live forks made from this stream
    ADD COLUMN forks                integer     NOT NULL DEFAULT 0 CHECK (forks >= 0),
    -- deleted while forks remain
    ADD COLUMN deleted_at           timestamptz,
    ADD CHECK ((forked_from_run IS NULL) = (fork_offset IS NULL));
