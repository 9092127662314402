package main

import (
	"flag"
	"fmt"
	"math/rand"
	"strings"
)

type appendReport struct {
	loopReport
	Surface     string  `json:"surface"`
	RecordBytes int     `json:"record_bytes"`
	Batch       int     `json:"batch"`
	AppendsPerS float64 `json:"appends_per_s"`
	RecordsPerS float64 `json:"records_per_s"` // appends_per_s x batch: every request is all or nothing
}

// appendBody is one record whose JSON payload is exactly size bytes (a string of 'x').
func appendBody(size int) []byte {
	return []byte(`{"data":` + payload(size) + `}`)
}

// batchBody is n such records in one request, the API's batch form.
func batchBody(size, n int) []byte {
	record := `{"data":` + payload(size) + `}`
	return []byte(`{"records":[` + strings.Repeat(record+",", n-1) + record + `]}`)
}

// payload is a JSON string of exactly size bytes, quotes included.
func payload(size int) string {
	if size < 2 {
		size = 2
	}
	return `"` + strings.Repeat("x", size-2) + `"`
}

// requestBody is what each request of the append mode sends: on the durable surface the record's
// bytes as they are (a text stream stores a POST's body as one record), on our API one record as
// today, or a batch of them.
func requestBody(t *target, size, batch int) ([]byte, error) {
	switch {
	case t.durable() && batch != 1:
		return nil, fmt.Errorf("-batch is for our API: a durable POST of text is one record")
	case t.durable():
		return []byte(strings.Repeat("x", size)), nil
	case batch == 1:
		return appendBody(size), nil
	default:
		return batchBody(size, batch), nil
	}
}

// runAppend: conns connections, each a loop of appends to a random stream (one record each, or -batch
// records). Requests that start in the warm-up are not counted.
func runAppend(args []string) error {
	fs := flag.NewFlagSet("append", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	t.surfaceFlag(fs)
	loop := addLoopFlags(fs, 32)
	size := fs.Int("size", 100, "bytes of each record (our API: of its JSON payload)")
	batch := fs.Int("batch", 1, "records per request (our API; 1 sends {\"data\":…}, more {\"records\":[…]})")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if *batch < 1 {
		return fmt.Errorf("-batch must be at least 1")
	}
	body, err := requestBody(&t, *size, *batch)
	if err != nil {
		return err
	}
	if err := loop.open(&t); err != nil {
		return err
	}
	urls := make([]string, t.streams)
	for i := range urls {
		urls[i] = t.appendPath(i)
	}
	ok := 201
	if t.durable() {
		ok = 204 // the protocol's answer to an append
	}

	r := closedLoop(&t, *loop.conns, *loop.warmup, *loop.duration, ok, func(c *conn, rng *rand.Rand) (int, int64, error) {
		status, _, err := c.do("POST", urls[rng.Intn(len(urls))], body)
		return status, 0, err
	})
	out := appendReport{
		loopReport: loop.report("append", &t, r), Surface: t.surface, RecordBytes: *size, Batch: *batch,
		AppendsPerS: loop.perSecond(float64(r.OK)), RecordsPerS: loop.perSecond(float64(r.OK * *batch)),
	}
	return report(out)
}
