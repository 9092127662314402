package main

import (
	"flag"
	"math/rand"
	"strings"
)

type appendReport struct {
	Mode        string         `json:"mode"`
	Connections int            `json:"connections"`
	Streams     int            `json:"streams"`
	RecordBytes int            `json:"record_bytes"`
	WarmupS     float64        `json:"warmup_s"`
	DurationS   float64        `json:"duration_s"`
	RequestsOK  int            `json:"requests_ok"`
	Errors      map[string]int `json:"errors"`
	AppendsPerS float64        `json:"appends_per_s"`
	LatencyMS   Latency        `json:"latency_ms"`
	CPUSeconds  float64        `json:"cpu_seconds"`
	CPUShare    float64        `json:"cpu_share"`
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
	conns, duration, warmup := loop.conns, loop.duration, loop.warmup
	size := fs.Int("size", 100, "bytes of each record's JSON payload")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if err := loop.check(); err != nil {
		return err
	}
	client := newClient(*conns)
	if err := t.create(client); err != nil {
		return err
	}
	body := appendBody(*size)
	urls := make([]string, t.streams)
	for i := range urls {
		urls[i] = t.recordsURL(i)
	}

	r := closedLoop(*conns, *warmup, *duration, 201, func(rng *rand.Rand) (int, int64, error) {
		status, _, err := t.post(client, urls[rng.Intn(len(urls))], body)
		return status, 0, err
	})
	out := appendReport{
		Mode: "append", Connections: *conns, Streams: t.streams, RecordBytes: *size,
		WarmupS: warmup.Seconds(), DurationS: duration.Seconds(), Errors: r.Errors, RequestsOK: r.OK,
	}
	out.AppendsPerS = round3(float64(r.OK) / duration.Seconds())
	out.LatencyMS = summarize(r.Latencies)
	out.CPUSeconds = round3(r.CPUSeconds)
	out.CPUShare = round3(r.CPUSeconds / duration.Seconds())
	return report(out)
}
