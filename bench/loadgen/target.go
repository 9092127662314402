package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// target is the server, run and streams a measurement talks to; the streams are {prefix}{i}.
type target struct {
	base    *url.URL // e.g. http://127.0.0.1:8080/api/workflow-streams
	token   string
	run     string
	prefix  string
	streams int
	pins    string // when set, the streams are created with these pins first
	// api: our API (-url …/api/workflow-streams); durable: the Durable Streams protocol surface of the
	// same server (-url …/api/durable-streams), whose stream <run>/<stream> is our (run, stream)
	surface string
}

// The durable surface's streams are created and appended to as text: a POST's body is one record,
// stored as it is sent, so the record is the same 100 bytes as our API's JSON string.
const durableType = "text/plain"

func (t *target) flags(fs *flag.FlagSet) (base *string) {
	base = fs.String("url", "http://127.0.0.1:8080/api/workflow-streams", "API base URL")
	fs.StringVar(&t.token, "token", "", "bearer token")
	fs.StringVar(&t.run, "run", "bench", "run id")
	fs.StringVar(&t.prefix, "prefix", "bench-", "stream ids are {prefix}{i}")
	fs.IntVar(&t.streams, "streams", 1, "number of streams")
	fs.StringVar(&t.pins, "create", "", "pins JSON: create the streams with it before measuring "+
		"(durable surface: any value creates them with PUT, the server's template giving the pins)")
	return base
}

// surfaceFlag adds -surface, for the modes that speak both surfaces (append, read, create).
func (t *target) surfaceFlag(fs *flag.FlagSet) {
	fs.StringVar(&t.surface, "surface", "api", "api (our API) | durable (the Durable Streams surface; "+
		"-url is then its base, e.g. http://127.0.0.1:8080/api/durable-streams)")
}

func (t *target) parse(base string) error {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("-url must be an http:// URL, got %q", base)
	}
	if t.streams < 1 {
		return fmt.Errorf("-streams must be at least 1")
	}
	switch t.surface {
	case "":
		t.surface = "api"
	case "api", "durable":
	default:
		return fmt.Errorf("-surface must be api or durable, got %q", t.surface)
	}
	t.base = u
	return nil
}

func (t *target) stream(i int) string { return fmt.Sprintf("%s%d", t.prefix, i) }

func (t *target) recordsURL(i int) string {
	return t.base.Scheme + "://" + t.base.Host + t.recordsPath(i)
}

// recordsPath is the path of stream i's records, for a request line.
func (t *target) recordsPath(i int) string {
	return fmt.Sprintf("%s/runs/%s/streams/%s/records", t.base.Path, t.run, t.stream(i))
}

func (t *target) durable() bool { return t.surface == "durable" }

// streamPath is the path of stream i on the durable surface, for a request line.
func (t *target) streamPath(i int) string {
	return fmt.Sprintf("%s/v1/stream/%s/%s", t.base.Path, t.run, t.stream(i))
}

// appendPath is where stream i's records are appended on t's surface.
func (t *target) appendPath(i int) string {
	if t.durable() {
		return t.streamPath(i)
	}
	return t.recordsPath(i)
}

// bodyType is the Content-Type of the bodies a mode sends to t's surface.
func (t *target) bodyType() string {
	if t.durable() {
		return durableType
	}
	return "application/json"
}

func (t *target) post(client *http.Client, url string, body []byte) (int, []byte, error) {
	return t.send(client, http.MethodPost, url, "application/json", body)
}

func (t *target) send(client *http.Client, method, url, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+t.token)
	req.Header.Set("Content-Type", contentType)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	// read it all, so the keep-alive connection is reused
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, answer, err
}

// create makes the streams (200 or 201 each), a few at a time; not part of any measurement.
func (t *target) create(client *http.Client) error {
	if t.pins == "" {
		return nil
	}
	work := make(chan int)
	errs := make(chan error, t.streams)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := t.createOne(client, i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < t.streams; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs // nil when the channel is empty
}

// createOne makes stream i: our API's create with the pins, or on the durable surface a PUT of an
// empty text stream, as the protocol's clients create one (the server's template gives the pins).
func (t *target) createOne(client *http.Client, i int) error {
	var status int
	var answer []byte
	var err error
	if t.durable() {
		origin := t.base.Scheme + "://" + t.base.Host
		status, answer, err = t.send(client, http.MethodPut, origin+t.streamPath(i), durableType, nil)
	} else {
		body := fmt.Sprintf(`{"stream_id":%q,"pins":%s}`, t.stream(i), t.pins)
		status, answer, err = t.post(client, fmt.Sprintf("%s/runs/%s/streams", t.base, t.run), []byte(body))
	}
	if err == nil && status != 200 && status != 201 {
		err = fmt.Errorf("creating %s: %d %s", t.stream(i), status, answer)
	}
	return err
}

func newClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			MaxConnsPerHost:     conns,
			MaxIdleConnsPerHost: conns,
			MaxIdleConns:        conns,
			DisableCompression:  true,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}

// errorKey names a failure for the report: the HTTP status, or what went wrong below HTTP.
func errorKey(status int, err error) string {
	if err != nil {
		msg := err.Error()
		for _, kind := range []string{"connection refused", "connection reset", "timeout", "EOF", "broken pipe"} {
			if strings.Contains(msg, kind) {
				return kind
			}
		}
		return "transport"
	}
	return fmt.Sprint(status)
}
