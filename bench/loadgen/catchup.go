package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

type catchupReport struct {
	Mode        string  `json:"mode"`
	Records     int64   `json:"records"`
	Requests    int64   `json:"requests"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	RecordsPerS float64 `json:"records_per_s"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	CPUShare    float64 `json:"cpu_share"`
}

// runCatchup reads one stream from the start to sequence -until, as a reader that fell behind does:
// page after page over one connection (api: our API's reads, following next_after; ds: the Durable
// Streams surface's, following Stream-Next-Offset), or one Server-Sent Events response (sse, ds-sse)
// until the event of -until. Bodies are read whole and not decoded beyond finding the next cursor.
func runCatchup(args []string) error {
	fs := flag.NewFlagSet("catchup", flag.ExitOnError)
	mode := fs.String("surface", "api", "api | ds | sse | ds-sse")
	base := fs.String("url", "", "the surface's base URL (…/api/workflow-streams or …/api/durable-streams)")
	token := fs.String("token", "", "bearer token")
	run := fs.String("run", "", "run id")
	stream := fs.String("stream", "", "stream id")
	until := fs.Int64("until", 0, "read until this sequence")
	limit := fs.Int("limit", 0, "api: ?limit= of each read (0: the server's default)")
	maxBytes := fs.Int("max-bytes", 0, "api: ?max_bytes= of each read (0: the server's default)")
	gzip := fs.Bool("gzip", false, "ask for gzip (and decompress it here)")
	_ = fs.Parse(args)
	if *base == "" || *run == "" || *stream == "" || *until < 1 {
		return fmt.Errorf("-url, -run, -stream and -until are required")
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: !*gzip, MaxIdleConnsPerHost: 1}}
	get := func(url string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		if *token != "" {
			req.Header.Set("Authorization", "Bearer "+*token)
		}
		resp, err := client.Do(req)
		if err == nil && resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
		}
		return resp, err
	}
	base2 := strings.TrimRight(*base, "/")
	streamURL := fmt.Sprintf("%s/v1/stream/%s/%s", base2, *run, *stream)
	recordsURL := fmt.Sprintf("%s/runs/%s/streams/%s/records", base2, *run, *stream)
	out := catchupReport{Mode: *mode}
	cpu0, start := cpuSeconds(), time.Now()
	var err error
	switch *mode {
	case "api", "ds":
		err = pages(*mode, get, recordsURL, streamURL, *limit, *maxBytes, *until, &out)
	case "sse":
		err = events(get, fmt.Sprintf("%s/runs/%s/streams/%s/subscribe?after=0", base2, *run, *stream), "\nid: ", *until, &out)
	case "ds-sse":
		err = events(get, streamURL+"?offset=-1&live=sse", `"streamNextOffset":"`, *until, &out)
	default:
		err = fmt.Errorf("unknown -surface %q", *mode)
	}
	if err != nil {
		return err
	}
	out.Seconds = round3(time.Since(start).Seconds())
	out.Records = *until
	out.RecordsPerS = round3(float64(*until) / time.Since(start).Seconds())
	out.CPUSeconds = round3(cpuSeconds() - cpu0)
	out.CPUShare = round3(out.CPUSeconds / time.Since(start).Seconds())
	return report(out)
}

var nextAfter = []byte(`"next_after":`)

// pages reads page after page until the cursor reaches until.
func pages(mode string, get func(string) (*http.Response, error), recordsURL, streamURL string, limit, maxBytes int, until int64, out *catchupReport) error {
	var cursor int64
	chunk := make([]byte, 1<<20) // reused: only a page's tail is kept (where next_after is)
	for cursor < until {
		url := fmt.Sprintf("%s?after=%d", recordsURL, cursor)
		if limit > 0 {
			url += fmt.Sprintf("&limit=%d", limit)
		}
		if maxBytes > 0 {
			url += fmt.Sprintf("&max_bytes=%d", maxBytes)
		}
		if mode == "ds" {
			url = fmt.Sprintf("%s?offset=%020d", streamURL, cursor)
		}
		resp, err := get(url)
		if err != nil {
			return err
		}
		body, size, err := tailOf(resp.Body, chunk)
		resp.Body.Close()
		if err != nil {
			return err
		}
		out.Bytes += size
		out.Requests++
		var next int64
		if mode == "ds" {
			next, err = strconv.ParseInt(resp.Header.Get("Stream-Next-Offset"), 10, 64)
		} else {
			i := bytes.LastIndex(body, nextAfter)
			if i < 0 {
				return fmt.Errorf("no next_after in %.200s", body)
			}
			tail := body[i+len(nextAfter):]
			end := bytes.IndexAny(tail, ",}")
			next, err = strconv.ParseInt(string(bytes.TrimSpace(tail[:end])), 10, 64)
		}
		if err != nil {
			return err
		}
		if next <= cursor {
			return fmt.Errorf("the cursor did not move past %d", cursor)
		}
		cursor = next
	}
	return nil
}

// tailOf reads a body to its end through chunk, returning its last bytes (at most 4 KiB) and its size.
func tailOf(r io.Reader, chunk []byte) ([]byte, int64, error) {
	var tail []byte
	var size int64
	for {
		n, err := r.Read(chunk)
		size += int64(n)
		if n > 0 {
			tail = append(tail, chunk[:n]...)
			if len(tail) > 4096 {
				tail = append(tail[:0], tail[len(tail)-4096:]...)
			}
		}
		if err == io.EOF {
			return tail, size, nil
		}
		if err != nil {
			return nil, size, err
		}
	}
}

// events reads one event stream until a marker (which may begin with a newline) carries a position >= until.
func events(get func(string) (*http.Response, error), url, marker string, until int64, out *catchupReport) error {
	resp, err := get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out.Requests = 1
	// Only the newest position matters, so each read is searched once, backwards, for the last marker
	// followed by its whole number: a reader of a million events a second must not parse every line
	// (reading line by line cost this process 0.23 cores beside a server of 0.35).
	buf := make([]byte, 1<<20)
	buf[0] = '\n' // as if a line ended before the stream: a marker may begin with a line's start
	carry := 1    // the tail of the read before, where a marker may have been cut
	for {
		n, err := resp.Body.Read(buf[carry:])
		out.Bytes += int64(n)
		data := buf[:carry+n]
		if position, ok := lastPosition(data, []byte(marker)); ok && position >= until {
			return nil
		}
		carry = copy(buf, data[max(0, len(data)-64):])
		if err != nil {
			return fmt.Errorf("the event stream ended before %d: %w", until, err)
		}
	}
}

// lastPosition is the number after the last marker in data that a non-digit ends (a number cut by the
// end of data is not whole yet).
func lastPosition(data, marker []byte) (int64, bool) {
	for end := len(data); end > 0; {
		at := bytes.LastIndex(data[:end], marker)
		if at < 0 {
			return 0, false
		}
		digits := data[at+len(marker):]
		i := 0
		for i < len(digits) && digits[i] >= '0' && digits[i] <= '9' {
			i++
		}
		if i > 0 && i < len(digits) {
			position, err := strconv.ParseInt(string(digits[:i]), 10, 64)
			return position, err == nil
		}
		end = at
	}
	return 0, false
}
