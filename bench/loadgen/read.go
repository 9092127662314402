package main

import (
	"flag"
	"fmt"
	"math/rand"
)

type readReport struct {
	loopReport
	Surface   string  `json:"surface"`
	After     int64   `json:"after"`
	Limit     int     `json:"limit"`
	ReadsPerS float64 `json:"reads_per_s"`
	BytesPerS float64 `json:"bytes_per_s"`
}

// runRead: conns connections, each a loop of page reads of a random stream (our API: GET
// .../records?after=K[&limit=N]; the durable surface: GET /v1/stream/<run>/<stream>?offset=K). Only a
// 200 counts, its body read whole; requests that start in the warm-up are not counted. The streams
// must exist and hold records past K (the caller loads them): this measures reads, not creates.
func runRead(args []string) error {
	fs := flag.NewFlagSet("read", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	t.surfaceFlag(fs)
	loop := addLoopFlags(fs, 8)
	after := fs.Int64("after", 0, "the cursor: each read asks for the records after this sequence")
	limit := fs.Int("limit", 0, "our API: ?limit= of each read, the records a page holds at most (0: not sent)")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if *after < 0 || *limit < 0 {
		return fmt.Errorf("-after and -limit must be at least 0")
	}
	if t.durable() && *limit > 0 {
		return fmt.Errorf("-limit is for our API: the protocol's reads have no limit")
	}
	if err := loop.open(&t); err != nil {
		return err
	}
	// built per request, not up front: a million streams would be a million strings held for nothing
	pathOf := func(i int) string { return readPath(&t, i, *after, *limit) }

	r := closedLoop(&t, *loop.conns, *loop.warmup, *loop.duration, 200, func(c *conn, rng *rand.Rand) (int, int64, error) {
		status, answer, err := c.do("GET", pathOf(rng.Intn(t.streams)), nil)
		return status, int64(len(answer)), err
	})
	out := readReport{
		loopReport: loop.report("read", &t, r), Surface: t.surface, After: *after, Limit: *limit,
		ReadsPerS: loop.perSecond(float64(r.OK)), BytesPerS: loop.perSecond(float64(r.Bytes)),
	}
	return report(out)
}

// readPath is the request path of one read of stream i after sequence after.
func readPath(t *target, i int, after int64, limit int) string {
	if t.durable() {
		return fmt.Sprintf("%s?offset=%020d", t.streamPath(i), after) // the offsets this server hands out
	}
	if limit > 0 {
		return fmt.Sprintf("%s?after=%d&limit=%d", t.recordsPath(i), after, limit)
	}
	return fmt.Sprintf("%s?after=%d", t.recordsPath(i), after)
}
