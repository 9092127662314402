package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
)

type readReport struct {
	loopReport
	After     int64   `json:"after"`
	ReadsPerS float64 `json:"reads_per_s"`
	BytesPerS float64 `json:"bytes_per_s"`
}

// get reads one page and all of its body (so the keep-alive connection is reused); returns the
// status and the body's length.
func (t *target) get(client *http.Client, url string) (int, int64, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+t.token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, n, err
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
	client, err := loop.open(&t)
	if err != nil {
		return err
	}
	// built per request, not up front: a million streams would be a million strings held for nothing
	urlOf := func(i int) string { return fmt.Sprintf("%s?after=%d", t.recordsURL(i), *after) }

	r := closedLoop(*loop.conns, *loop.warmup, *loop.duration, 200, func(rng *rand.Rand) (int, int64, error) {
		return t.get(client, urlOf(rng.Intn(t.streams)))
	})
	out := readReport{
		loopReport: loop.report("read", &t, r), After: *after,
		ReadsPerS: loop.perSecond(float64(r.OK)), BytesPerS: loop.perSecond(float64(r.Bytes)),
	}
	return report(out)
}
