-- Barrier commits (store/wal.py, runtime/durability.py): a process confirms that what it read is as
-- durable as an acknowledged append by committing a write after the read. A row per slot, so processes
-- rarely wait on each other's row lock; the updates are HOT (no index column changes).
CREATE TABLE wfs_barriers (
    slot smallint PRIMARY KEY,
    commits bigint NOT NULL DEFAULT 0
);
INSERT INTO wfs_barriers (slot) SELECT generate_series(0, 63);
