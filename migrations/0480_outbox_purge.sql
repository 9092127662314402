-- Migration 480: finished rows leave the deletion outbox.
--
-- A deletion's row was kept forever once the object was gone (deleted_at set), so the table grew with
-- every object ever deleted. The object janitor now purges rows finished longer ago than
-- WFS_DELETION_OUTBOX_RETENTION_SECONDS, oldest first, in bounded batches.

-- The purge's only way in: finished rows in the order they finished. Unfinished rows are not in it
-- (they are in wfs_deletion_outbox_due), so the purge never scans the work still to do.
CREATE INDEX wfs_deletion_outbox_finished ON wfs_deletion_outbox (deleted_at) WHERE deleted_at IS NOT NULL;
