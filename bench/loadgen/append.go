package main

import (
	"flag"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"
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
	conns := fs.Int("conns", 32, "keep-alive connections, one request in flight on each")
	duration := fs.Duration("duration", 10*time.Second, "measured time")
	warmup := fs.Duration("warmup", 2*time.Second, "time before measuring")
	size := fs.Int("size", 100, "bytes of each record's JSON payload")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if *conns < 1 {
		return fmt.Errorf("-conns must be at least 1")
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

	type result struct {
		ok        int
		errors    map[string]int
		latencies []time.Duration
	}
	results := make([]result, *conns)
	start := time.Now()
	from, until := start.Add(*warmup), start.Add(*warmup+*duration)
	var cpuFrom, cpuUntil float64
	var wg sync.WaitGroup
	wg.Add(1)
	phase("warming")
	go func() { // CPU is sampled at the window's edges, not at process start
		defer wg.Done()
		time.Sleep(time.Until(from))
		cpuFrom = cpuSeconds()
		phase("measuring")
		time.Sleep(time.Until(until))
		cpuUntil = cpuSeconds()
		phase("measured")
	}()
	for w := 0; w < *conns; w++ {
		wg.Add(1)
		go func(r *result, seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			r.errors = map[string]int{}
			for {
				began := time.Now()
				if !began.Before(until) {
					return
				}
				status, _, err := t.post(client, urls[rng.Intn(len(urls))], body)
				took := time.Since(began)
				counted := !began.Before(from)
				if err == nil && status == 201 {
					if counted {
						r.ok++
						r.latencies = append(r.latencies, took)
					}
					continue
				}
				if counted {
					r.errors[errorKey(status, err)]++
				}
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a refused connection must not spin
				}
			}
		}(&results[w], start.UnixNano()+int64(w))
	}
	wg.Wait()

	out := appendReport{
		Mode: "append", Connections: *conns, Streams: t.streams, RecordBytes: *size,
		WarmupS: warmup.Seconds(), DurationS: duration.Seconds(), Errors: map[string]int{},
	}
	var all []time.Duration
	for _, r := range results {
		out.RequestsOK += r.ok
		all = append(all, r.latencies...)
		for k, v := range r.errors {
			out.Errors[k] += v
		}
	}
	out.AppendsPerS = round3(float64(out.RequestsOK) / duration.Seconds())
	out.LatencyMS = summarize(all)
	out.CPUSeconds = round3(cpuUntil - cpuFrom)
	out.CPUShare = round3((cpuUntil - cpuFrom) / duration.Seconds())
	return report(out)
}
