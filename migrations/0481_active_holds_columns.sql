-- Migration 481: the active-hold view carries each hold's columns (issue 18).
--
-- Migration 479 made wfs_active_holds THE active-hold predicate, but it said only which streams are
-- held, so a stream's state and the stream listing still read the unreleased rows of wfs_legal_holds
-- themselves: the rule "released_at IS NULL" was written three times. The view now lists every active
-- hold with who placed it, when and why, and every reader asks it.
--
-- One row per active hold, where it was one row per held stream: the readers that only ask whether a
-- stream is held use EXISTS, which means the same either way. CREATE OR REPLACE VIEW keeps run_id and
-- stream_id first (it may only append columns); a hold's primary key includes them, so DISTINCT would
-- remove nothing now and is dropped.
CREATE OR REPLACE VIEW wfs_active_holds (run_id, stream_id, hold_id, reason, held_by, held_at) AS
    SELECT run_id, stream_id, hold_id, reason, held_by, held_at FROM wfs_legal_holds WHERE released_at IS NULL;
