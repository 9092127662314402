package main

import (
	"flag"
	"fmt"
	"math/rand"
)

type readReport struct {
	loopReport
	After     int64   `json:"after"`
	ReadsPerS float64 `json:"reads_per_s"`
	BytesPerS float64 `json:"bytes_per_s"`
}

// runRead: conns connections, each a loop of page reads (GET .../records?after=K) of a random stream.
// Only a 200 counts; requests that start in the warm-up are not counted. The streams must exist and
// hold records past K (the caller loads them): this measures reads, not creates.
func runRead(args []string) error {
	fs := flag.NewFlagSet("read", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	loop := addLoopFlags(fs, 8)
	after := fs.Int64("after", 0, "the cursor: each read asks for the records after this sequence")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if *after < 0 {
		return fmt.Errorf("-after must be at least 0")
	}
	if err := loop.open(&t); err != nil {
		return err
	}
	// built per request, not up front: a million streams would be a million strings held for nothing
	pathOf := func(i int) string { return fmt.Sprintf("%s?after=%d", t.recordsPath(i), *after) }

	r := closedLoop(&t, *loop.conns, *loop.warmup, *loop.duration, 200, func(c *conn, rng *rand.Rand) (int, int64, error) {
		status, answer, err := c.do("GET", pathOf(rng.Intn(t.streams)), nil)
		return status, int64(len(answer)), err
	})
	out := readReport{
		loopReport: loop.report("read", &t, r), After: *after,
		ReadsPerS: loop.perSecond(float64(r.OK)), BytesPerS: loop.perSecond(float64(r.Bytes)),
	}
	return report(out)
}
