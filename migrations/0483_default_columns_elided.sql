-- Migration 483: a record row does not store what its stream already says (issue 14: at most 250 bytes
-- on disk per 100-byte record, indexes included; after 482 the steady state measured 265).
--
-- Two text columns repeated the same value on nearly every row: the content type, almost always the
-- API's default (application/json, 17 bytes), and the appending principal, almost always the principal
-- that created the stream (a service account's name is ~40 bytes). Each is now NULL when it is that
-- default; the row's null bitmap already exists (payload or object is always NULL), so a NULL costs
-- nothing. Readers get the content type back in SQL (store/reads.py: RECORD_COLUMNS); nothing in the
-- product reads appended_by, and an audit query reads coalesce(r.appended_by, s.created_by).
--
-- Cost on a big table: none. Only the NOT NULL constraints go (a catalog change); existing rows keep
-- their stored values, which read back the same, and age out with retention.
ALTER TABLE wfs_records ALTER COLUMN content_type DROP NOT NULL;
ALTER TABLE wfs_records ALTER COLUMN appended_by DROP NOT NULL;

COMMENT ON COLUMN wfs_records.content_type IS
    'NULL: application/json, the API''s default (domain.records.DEFAULT_CONTENT_TYPE)';
COMMENT ON COLUMN wfs_records.appended_by IS
    'NULL: the principal that created the stream (wfs_streams.created_by)';
