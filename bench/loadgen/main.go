// Command wfs-loadgen is the benchmark's load generator: compiled, so that the figures measure the
// server and not the client. It prints one JSON report on stdout, with its own CPU time beside the
// figures so a reader can tell when the generator, not the server, was the limit.
//
//	wfs-loadgen append -url http://127.0.0.1:8080/api/workflow-streams -token T -run r -streams 1000 -conns 32 -duration 10s
//	wfs-loadgen append -url ... -token T -run r -streams 1000 -batch 100   (100 records a request)
//	wfs-loadgen append -surface durable -url http://127.0.0.1:8080/api/durable-streams -token T -run r -streams 1000 -create put
//	wfs-loadgen sse    -url ... -token T -run r -streams 1000 -subscribers 10000 -rate 100 -duration 10s
//	wfs-loadgen read   -url ... -token T -run r -streams 1000000 -conns 8 -after 5 -duration 10s
//	wfs-loadgen read   -url ... -token T -run r -streams 1000 -conns 32 -after 0 -limit 1
//	wfs-loadgen create -url ... -token T -run r -streams 1000 -create '{"direction": ...}'
//	wfs-loadgen catchup -surface api|ds|sse|ds-sse -url ... -token T -run r -stream s -until 200000
//
// Each subcommand writes "phase: <name>" lines to stderr as it moves between phases (append, read:
// warming, measuring, measured; sse: connecting, appending, draining, done), so a caller can sample
// the server's CPU over exactly the measured window.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "append":
		err = runAppend(os.Args[2:])
	case "read":
		err = runRead(os.Args[2:])
	case "sse":
		err = runSSE(os.Args[2:])
	case "create":
		err = runCreate(os.Args[2:])
	case "catchup":
		err = runCatchup(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wfs-loadgen:", err)
		os.Exit(1)
	}
}

// phase tells the caller (on stderr) that a phase begins.
func phase(name string) { fmt.Fprintf(os.Stderr, "phase: %s\n", name) }

func runCreate(args []string) error {
	fs := flag.NewFlagSet("create", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	t.surfaceFlag(fs)
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if t.pins == "" {
		return fmt.Errorf("-create (the pins) is required")
	}
	return t.create(newClient(16))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: wfs-loadgen append|read|sse|create|catchup [flags] (-h for the flags of each)")
	os.Exit(2)
}

// cpuSeconds is this process's own CPU time (user + system), all threads.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// raiseOpenFiles lifts the soft RLIMIT_NOFILE to the hard limit: 10,000 subscribers are 10,000 sockets.
func raiseOpenFiles() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

// Latency is a percentile summary in milliseconds.
type Latency struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99.9"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(q float64) float64 {
		i := int(q * float64(len(samples)))
		if i >= len(samples) {
			i = len(samples) - 1
		}
		return ms(samples[i])
	}
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Latency{
		N: len(samples), P50: at(0.50), P90: at(0.90), P99: at(0.99), P999: at(0.999),
		Max: ms(samples[len(samples)-1]), Mean: ms(sum / time.Duration(len(samples))),
	}
}

func ms(d time.Duration) float64 { return round3(float64(d) / 1e6) }

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

func report(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
