package main

import (
	"flag"
	"math/rand"
	"strings"
)

type appendReport struct {
	loopReport
	RecordBytes int     `json:"record_bytes"`
	AppendsPerS float64 `json:"appends_per_s"`
}

// appendBody is one record whose JSON payload is exactly size bytes (a string of 'x').
func appendBody(size int) []byte {
	if size < 2 {
		size = 2
	}
	return []byte(`{"data":"` + strings.Repeat("x", size-2) + `"}`)
}

// runAppend: conns connections, each a loop of one-record appends to a random stream. Requests that
// start in the warm-up are not counted.
func runAppend(args []string) error {
	fs := flag.NewFlagSet("append", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	loop := addLoopFlags(fs, 32)
	size := fs.Int("size", 100, "bytes of each record's JSON payload")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if err := loop.open(&t); err != nil {
		return err
	}
	body := appendBody(*size)
	urls := make([]string, t.streams)
	for i := range urls {
		urls[i] = t.recordsPath(i)
	}

	r := closedLoop(&t, *loop.conns, *loop.warmup, *loop.duration, 201, func(c *conn, rng *rand.Rand) (int, int64, error) {
		status, _, err := c.do("POST", urls[rng.Intn(len(urls))], body)
		return status, 0, err
	})
	out := appendReport{
		loopReport: loop.report("append", &t, r), RecordBytes: *size, AppendsPerS: loop.perSecond(float64(r.OK)),
	}
	return report(out)
}
