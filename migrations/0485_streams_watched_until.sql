-- Migration 485: a stream row says until when some process watches it (issue 13: appends at the speed
-- of Postgres).
--
-- After each group commit a process told every other process about every stream it appended to, with
-- a NOTIFY: one transaction of its own plus one more in every listening backend, and a payload every
-- other process decoded. Where nobody in another process watched those streams, all of it was for
-- nothing, and it grows with the processes listening: with four workers, 1,000 streams x 32
-- connections went from 4,303 to 4,781 appends/s once only watched streams were announced (bench.ab,
-- 3 rounds; with two workers, inside the noise). A process that starts watching a stream now marks it
-- (runtime.interest) before its first read, and appenders pass on only the signals of marked streams.
--
-- The mark is an UPDATE of the stream row, so it takes the row lock that appends hold until COMMIT:
-- an append either committed before the mark (the watcher's first read, which follows the mark, sees
-- its records) or locked the row after it and read the mark (and announces its commit). Marks are
-- renewed while the watch lasts; an expired one costs latency (the head poller), never a record.
--
-- Cost on a big table: none (a nullable column without a default is a catalog change). The column is
-- not indexed, so marking keeps the update HOT.
ALTER TABLE wfs_streams ADD COLUMN watched_until timestamptz;

COMMENT ON COLUMN wfs_streams.watched_until IS
    'Some process watches this stream until then: appends announce their commits to other processes (runtime.interest)';
