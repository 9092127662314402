package main

import (
	"flag"
	"fmt"
	"math/rand"
	"sync"
	"time"
)

// loopFlags are the flags of every closed-loop mode: connections, measured time, warm-up.
type loopFlags struct {
	conns            *int
	duration, warmup *time.Duration
}

func addLoopFlags(fs *flag.FlagSet, conns int) loopFlags {
	return loopFlags{
		conns:    fs.Int("conns", conns, "keep-alive connections, one request in flight on each"),
		duration: fs.Duration("duration", 10*time.Second, "measured time"),
		warmup:   fs.Duration("warmup", 2*time.Second, "time before measuring"),
	}
}

// open checks the loop's flags and creates the target's streams when -create asks for it: what
// every closed-loop mode does before it runs. The loops themselves talk over their own conns.
func (f loopFlags) open(t *target) error {
	if *f.conns < 1 {
		return fmt.Errorf("-conns must be at least 1")
	}
	return t.create(newClient(16))
}

// loopReport is the part of a closed-loop mode's JSON report every mode has.
type loopReport struct {
	Mode        string         `json:"mode"`
	Connections int            `json:"connections"`
	Streams     int            `json:"streams"`
	WarmupS     float64        `json:"warmup_s"`
	DurationS   float64        `json:"duration_s"`
	RequestsOK  int            `json:"requests_ok"`
	Errors      map[string]int `json:"errors"`
	LatencyMS   Latency        `json:"latency_ms"`
	CPUSeconds  float64        `json:"cpu_seconds"`
	CPUShare    float64        `json:"cpu_share"`
}

// report is the common part of the report on r, a run of this loop against t.
func (f loopFlags) report(mode string, t *target, r loopResult) loopReport {
	return loopReport{
		Mode: mode, Connections: *f.conns, Streams: t.streams,
		WarmupS: f.warmup.Seconds(), DurationS: f.duration.Seconds(), RequestsOK: r.OK, Errors: r.Errors,
		LatencyMS:  summarize(r.Latencies),
		CPUSeconds: round3(r.CPUSeconds),
		CPUShare:   round3(r.CPUSeconds / f.duration.Seconds()),
	}
}

// perSecond is n over the measured time.
func (f loopFlags) perSecond(n float64) float64 { return round3(n / f.duration.Seconds()) }

// loopResult is what a closed loop measured over its window (the warm-up excluded).
type loopResult struct {
	OK         int
	Bytes      int64
	Errors     map[string]int
	Latencies  []time.Duration
	CPUSeconds float64 // the generator's own CPU over the window
}

// closedLoop runs conns loops, each one request in flight at a time on its own keep-alive
// connection to t, for warmup+duration. request makes one request on the loop's connection with the
// loop's own random source and returns the status, the bytes it read and any error; a status of ok
// counts. Only requests that start after the warm-up are counted. The
// "phase: warming/measuring/measured" lines on stderr let the caller sample the server over exactly
// the window.
func closedLoop(t *target, conns int, warmup, duration time.Duration, ok int,
	request func(c *conn, rng *rand.Rand) (int, int64, error)) loopResult {
	type result struct {
		ok        int
		bytes     int64
		errors    map[string]int
		latencies []time.Duration
	}
	results := make([]result, conns)
	start := time.Now()
	from, until := start.Add(warmup), start.Add(warmup+duration)
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
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func(r *result, seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			c := t.dial()
			r.errors = map[string]int{}
			for {
				began := time.Now()
				if !began.Before(until) {
					return
				}
				status, n, err := request(c, rng)
				took := time.Since(began)
				counted := !began.Before(from)
				if err == nil && status == ok {
					if counted {
						r.ok++
						r.bytes += n
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

	out := loopResult{Errors: map[string]int{}, CPUSeconds: cpuUntil - cpuFrom}
	for _, r := range results {
		out.OK += r.ok
		out.Bytes += r.bytes
		out.Latencies = append(out.Latencies, r.latencies...)
		for k, v := range r.errors {
			out.Errors[k] += v
		}
	}
	return out
}
