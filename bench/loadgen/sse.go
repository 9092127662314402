package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type sseReport struct {
	Mode                string         `json:"mode"`
	Subscribers         int            `json:"subscribers"`
	Streams             int            `json:"streams"`
	Rate                float64        `json:"rate"`
	DurationS           float64        `json:"duration_s"`
	OpenFilesLimit      uint64         `json:"open_files_limit"`
	ConnectSeconds      float64        `json:"connect_seconds"`
	Connected           int            `json:"connected"`
	ConnectErrors       map[string]int `json:"connect_errors"`
	ConnectCPUSeconds   float64        `json:"connect_cpu_seconds"`
	Backlog             int            `json:"backlog"`           // records per stream before anyone connects
	CaughtUpSeconds     float64        `json:"caught_up_seconds"` // from the burst until every subscriber read its backlog
	Appended            int            `json:"appended"`
	AppendErrors        map[string]int `json:"append_errors"`
	AppendsPerS         float64        `json:"appends_per_s"`
	AppendLatencyMS     Latency        `json:"append_latency_ms"`
	ForeignSequences    int            `json:"foreign_sequences"`
	Expected            int64          `json:"expected"` // over connected subscribers
	UnconnectedExpected int64          `json:"unconnected_expected"`
	Delivered           int64          `json:"delivered"`
	Duplicates          int64          `json:"duplicates"`
	Gaps                int64          `json:"gaps"`
	Missing             int64          `json:"missing"`
	Incomplete          int            `json:"incomplete_subscribers"`
	Disconnects         map[string]int `json:"disconnects"`
	DrainSeconds        float64        `json:"drain_seconds"`
	LatencyMS           Latency        `json:"latency_ms"`
	CPUSeconds          float64        `json:"cpu_seconds"`
	CPUShare            float64        `json:"cpu_share"`
}

// subscriber is one SSE connection to stream index `stream`. Only its own goroutine writes its
// fields, except `last`, which the drain loop reads while it runs.
type subscriber struct {
	stream     int
	conn       net.Conn
	lines      *bufio.Reader
	connectErr string
	last       atomic.Int64 // highest sequence delivered in order
	delivered  int64
	duplicates int64
	gaps       int64
	skipped    int64 // sequences jumped over by gaps
	latencies  []time.Duration
	endedBy    string      // why the stream ended, written before `ended` is set
	ended      atomic.Bool // the stream ended on its own (server closed it, or an error event)
}

var errStatus = errors.New("status")

// connect opens the subscription and reads up to the server's first `retry:` line, retrying
// refused or failed attempts until the deadline.
func (s *subscriber) connect(t *target, deadline time.Time, errs func(string)) bool {
	path := fmt.Sprintf("%s/runs/%s/streams/%s/subscribe?after=0", t.base.Path, t.run, t.stream(s.stream))
	request := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n",
		path, t.base.Host, t.token)
	for time.Now().Before(deadline) {
		key, err := s.attempt(t.base.Host, request, deadline)
		if err == nil {
			return true
		}
		errs(key)
		s.connectErr = key
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (s *subscriber) attempt(host, request string, deadline time.Time) (string, error) {
	conn, err := net.DialTimeout("tcp", host, time.Until(deadline))
	if err != nil {
		return "dial: " + errorKey(0, err), err
	}
	_ = conn.SetDeadline(deadline)
	fail := func(key string, err error) (string, error) {
		conn.Close()
		return key, err
	}
	if _, err := conn.Write([]byte(request)); err != nil {
		return fail("write: "+errorKey(0, err), err)
	}
	raw := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(raw, nil)
	if err != nil {
		return fail("headers: "+errorKey(0, err), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Sprintf("status %d", resp.StatusCode), errStatus)
	}
	// resp.Body undoes the chunked transfer encoding
	lines := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			return fail("first line: "+errorKey(0, err), err)
		}
		if strings.HasPrefix(line, "retry:") {
			break
		}
	}
	_ = conn.SetDeadline(time.Time{})
	s.conn, s.lines = conn, lines
	return "", nil
}

// follow reads events until the connection ends, checking that sequences are consecutive.
func (s *subscriber) follow() {
	var id int64 = -1
	event := ""
	var data []byte
	for {
		line, err := s.lines.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) { // a record longer than the buffer
			rest, err2 := s.lines.ReadBytes('\n')
			line, err = append(append([]byte{}, line...), rest...), err2
		}
		if err != nil {
			if s.endedBy == "" { // a close or error event already said why
				s.endedBy = errorKey(0, err)
			}
			s.ended.Store(true)
			return
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0: // end of an event
			if event == "record" && id >= 0 {
				s.record(id, data)
			} else if event == "close" || event == "error" {
				s.endedBy = "event: " + event
			}
			id, event, data = -1, "", nil
		case bytes.HasPrefix(line, []byte("id:")):
			id, _ = strconv.ParseInt(string(bytes.TrimSpace(line[3:])), 10, 64)
		case bytes.HasPrefix(line, []byte("event:")):
			event = string(bytes.TrimSpace(line[6:]))
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data[:0], bytes.TrimSpace(line[5:])...)
		}
	}
}

var sentAt = []byte(`"t":`)

func (s *subscriber) record(sequence int64, data []byte) {
	now := time.Now().UnixNano()
	last := s.last.Load()
	switch {
	case sequence <= last:
		s.duplicates++
		return
	case sequence > last+1:
		s.gaps++
		s.skipped += sequence - last - 1
	}
	s.delivered++
	s.last.Store(sequence)
	// the send time the appender put in the record: {"t":<unix ns>,...}; a scan, not a JSON decode
	if i := bytes.Index(data, sentAt); i >= 0 {
		var t int64
		for _, c := range data[i+len(sentAt):] {
			if c < '0' || c > '9' {
				break
			}
			t = t*10 + int64(c-'0')
		}
		if t > 0 {
			s.latencies = append(s.latencies, time.Duration(now-t))
		}
	}
}

// appender posts `rate` records per second in total, round robin over the streams, from a few
// connections; it keeps every sequence the server answered, per stream.
type appender struct {
	t         *target
	client    *http.Client
	mu        sync.Mutex
	sequences map[int][]int64
	errors    map[string]int
	latencies []time.Duration
}

func (a *appender) run(rate float64, duration time.Duration, conns int) {
	jobs := make(chan int, conns)
	var wg sync.WaitGroup
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pad := strings.Repeat("x", 60) // ~100 bytes of payload with the send time
			for stream := range jobs {
				began := time.Now()
				body := fmt.Sprintf(`{"data":{"t":%d,"p":"%s"}}`, began.UnixNano(), pad)
				status, answer, err := a.t.post(a.client, a.t.recordsURL(stream), []byte(body))
				took := time.Since(began)
				var got struct {
					Sequences []int64 `json:"sequences"`
				}
				if err == nil && status == 201 {
					err = json.Unmarshal(answer, &got)
				}
				a.mu.Lock()
				if err == nil && status == 201 {
					a.sequences[stream] = append(a.sequences[stream], got.Sequences...)
					a.latencies = append(a.latencies, took)
				} else {
					a.errors[errorKey(status, err)]++
				}
				a.mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for k := 0; ; k++ {
		at := start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
		if at.Sub(start) >= duration {
			break
		}
		time.Sleep(time.Until(at))
		jobs <- k % a.t.streams
	}
	close(jobs)
	wg.Wait()
}

func runSSE(args []string) error {
	fs := flag.NewFlagSet("sse", flag.ExitOnError)
	var t target
	base := t.flags(fs)
	subscribers := fs.Int("subscribers", 100, "SSE subscribers, round robin over the streams")
	rate := fs.Float64("rate", 50, "appends per second in total, round robin over the streams")
	duration := fs.Duration("duration", 10*time.Second, "time appending")
	appendConns := fs.Int("append-conns", 8, "connections of the appender")
	connectTimeout := fs.Duration("connect-timeout", 60*time.Second, "give up connecting subscribers after this")
	drainTimeout := fs.Duration("drain-timeout", 15*time.Second, "wait this long for the last records to arrive")
	backlog := fs.Int("backlog", 0, "records appended to each stream before the subscribers connect (they read them from the start)")
	_ = fs.Parse(args)
	if err := t.parse(*base); err != nil {
		return err
	}
	if *subscribers < 1 || *rate <= 0 || *appendConns < 1 {
		return fmt.Errorf("-subscribers, -rate and -append-conns must be positive")
	}
	out := sseReport{
		Mode: "sse", Subscribers: *subscribers, Streams: t.streams, Rate: *rate, DurationS: duration.Seconds(),
		OpenFilesLimit: raiseOpenFiles(), ConnectErrors: map[string]int{}, Disconnects: map[string]int{},
	}
	client := newClient(*appendConns)
	if err := t.create(client); err != nil {
		return err
	}
	a := &appender{t: &t, client: client, sequences: map[int][]int64{}, errors: map[string]int{}}
	if err := a.prefill(*backlog, *appendConns); err != nil {
		return err
	}
	out.Backlog = *backlog

	// connect everyone at once, as a burst of reconnecting clients would
	subs := make([]*subscriber, *subscribers)
	var mu sync.Mutex
	countErr := func(key string) {
		mu.Lock()
		out.ConnectErrors[key]++
		mu.Unlock()
	}
	var ready, done sync.WaitGroup
	phase("connecting")
	cpu0 := cpuSeconds()
	started := time.Now()
	deadline := started.Add(*connectTimeout)
	var connected atomic.Int64
	var lastConnected atomic.Int64 // unix ns when the latest subscriber got its first line
	for i := range subs {
		s := &subscriber{stream: i % t.streams}
		subs[i] = s
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ok := s.connect(&t, deadline, countErr)
			if ok {
				connected.Add(1)
				now := time.Now().UnixNano()
				for prev := lastConnected.Load(); now > prev && !lastConnected.CompareAndSwap(prev, now); {
					prev = lastConnected.Load()
				}
			}
			ready.Done()
			if ok {
				s.follow()
			}
		}()
	}
	ready.Wait()
	out.Connected = int(connected.Load())
	caughtUp := make(chan float64, 1)
	go func() { // every connected subscriber has read its stream's backlog
		for {
			behind := false
			for _, s := range subs {
				if s.conn != nil && !s.ended.Load() && s.last.Load() < int64(*backlog) {
					behind = true
					break
				}
			}
			if !behind || time.Since(started) > *connectTimeout {
				caughtUp <- time.Since(started).Seconds()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if out.Connected > 0 {
		out.ConnectSeconds = round3(float64(lastConnected.Load()-started.UnixNano()) / 1e9)
	} else {
		out.ConnectSeconds = round3(time.Since(started).Seconds())
	}
	cpu1 := cpuSeconds()
	out.ConnectCPUSeconds = round3(cpu1 - cpu0)

	phase("appending")
	began := time.Now()
	a.run(*rate, *duration, *appendConns)
	appendSeconds := time.Since(began).Seconds()

	// what each stream should hold: the appender's sequences, which must be 1..n as nobody else appends
	latest := make([]int64, t.streams)
	for stream, seqs := range a.sequences {
		seen := map[int64]bool{}
		for _, q := range seqs {
			seen[q] = true
			latest[stream] = max(latest[stream], q)
		}
		out.ForeignSequences += int(latest[stream]) - len(seen)
		out.Appended += len(seqs) - *backlog
	}
	phase("draining")
	drainFrom := time.Now()
	for time.Since(drainFrom) < *drainTimeout {
		behind := false
		for _, s := range subs {
			if s.conn != nil && !s.ended.Load() && s.last.Load() < latest[s.stream] {
				behind = true
				break
			}
		}
		if !behind {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	out.DrainSeconds = round3(time.Since(drainFrom).Seconds())
	out.CaughtUpSeconds = round3(<-caughtUp)
	cpu2 := cpuSeconds()
	phase("done")
	out.CPUSeconds = round3(cpu2 - cpu1)
	out.CPUShare = round3((cpu2 - cpu1) / time.Since(began).Seconds())

	// close every subscription; a stream the server ended on its own is a disconnect
	endedEarly := make([]bool, len(subs))
	for i, s := range subs {
		if s.conn != nil {
			endedEarly[i] = s.ended.Load()
			s.conn.Close()
		}
	}
	done.Wait()
	var all []time.Duration
	for i, s := range subs {
		expected := latest[s.stream]
		if s.conn == nil { // never connected: counted apart, so missing means lost by a live subscription
			out.UnconnectedExpected += expected
			out.Disconnects["never connected: "+s.connectErr]++
			continue
		}
		out.Expected += expected
		out.Delivered += s.delivered
		out.Duplicates += s.duplicates
		out.Gaps += s.gaps
		missing := expected - s.delivered
		if missing > 0 {
			out.Missing += missing
			out.Incomplete++
		}
		if endedEarly[i] {
			out.Disconnects[s.endedBy]++
		}
		all = append(all, s.latencies...)
	}
	out.AppendErrors = a.errors
	out.AppendsPerS = round3(float64(out.Appended) / appendSeconds)
	out.AppendLatencyMS = summarize(a.latencies)
	out.LatencyMS = summarize(all)
	return report(out)
}

// prefill appends `backlog` records to every stream (batches of up to 1,000, without a send time:
// they count for order, not latency), keeping their sequences with the live ones.
func (a *appender) prefill(backlog, conns int) error {
	if backlog <= 0 {
		return nil
	}
	record := fmt.Sprintf(`{"data":{"p":"%s"}}`, strings.Repeat("x", 80))
	jobs := make(chan int)
	errs := make(chan error, a.t.streams)
	var wg sync.WaitGroup
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stream := range jobs {
				for left := backlog; left > 0; left -= 1000 {
					n := min(left, 1000)
					body := `{"records":[` + strings.TrimSuffix(strings.Repeat(record+",", n), ",") + `]}`
					status, answer, err := a.t.post(a.client, a.t.recordsURL(stream), []byte(body))
					var got struct {
						Sequences []int64 `json:"sequences"`
					}
					if err == nil && status != 201 {
						err = fmt.Errorf("backlog append: status %d: %s", status, answer)
					}
					if err == nil {
						err = json.Unmarshal(answer, &got)
					}
					if err != nil {
						errs <- err
						break
					}
					a.mu.Lock()
					a.sequences[stream] = append(a.sequences[stream], got.Sequences...)
					a.mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < a.t.streams; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs
}
