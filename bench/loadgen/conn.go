package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// conn is one keep-alive HTTP/1.1 connection that sends a request and reads its answer in the
// calling goroutine, the way wrk does: one write of prepared bytes, one buffered read. The closed
// loops (append, read) use it instead of net/http's client, whose transport hands every request
// and response between goroutines: measured at 1,000 streams x 32 connections, net/http cost the
// generator ~50 µs of CPU per request, a quarter of a core taken from the server it measures on
// a two-core machine. It speaks only what this server answers: Content-Length or chunked bodies, and
// 204s without either.
type conn struct {
	host, auth string
	bodyType   string // the Content-Type of the bodies it sends (the target surface's)
	nc         net.Conn
	r          *bufio.Reader
	req        []byte // the request being written, reused
	answer     []byte // the last answer's body, reused (valid until the next request)
}

func (t *target) dial() *conn {
	return &conn{host: t.base.Host, auth: "Bearer " + t.token, bodyType: t.bodyType()}
}

var errMalformed = errors.New("malformed response")

// do sends one request on the connection (dialling it first if it is closed) and reads the whole
// answer; it returns the status and the body, which is only valid until the next call. Any error
// closes the connection: the next call dials a new one.
func (c *conn) do(method, path string, body []byte) (int, []byte, error) {
	status, err := c.roundTrip(method, path, body)
	if err != nil && c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	return status, c.answer, err
}

func (c *conn) roundTrip(method, path string, body []byte) (int, error) {
	if c.nc == nil {
		nc, err := net.DialTimeout("tcp", c.host, 10*time.Second)
		if err != nil {
			return 0, err
		}
		c.nc, c.r = nc, bufio.NewReaderSize(nc, 16<<10)
	}
	b := c.req[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nAuthorization: "...)
	b = append(b, c.auth...)
	if body != nil {
		b = append(b, "\r\nContent-Type: "...)
		b = append(b, c.bodyType...)
		b = append(b, "\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.req = b
	if err := c.nc.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := c.nc.Write(b); err != nil {
		return 0, err
	}
	return c.readAnswer()
}

// readAnswer reads the status line, the headers it needs and the body into c.answer.
func (c *conn) readAnswer() (int, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 201 Created\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, errMalformed
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, errMalformed
	}
	length, chunked, closing := -1, false, false
	for {
		line, err = c.r.ReadSlice('\n')
		if err != nil {
			return status, err
		}
		if len(line) <= 2 { // the blank line ending the headers
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			return status, errMalformed
		}
		name, value := line[:colon], bytes.TrimSpace(line[colon+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return status, errMalformed
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	c.answer = c.answer[:0]
	switch {
	case status == 204 || status == 304: // never a body, and often no Content-Length (the durable surface's appends)
	case chunked:
		err = c.readChunks()
	case length >= 0:
		err = c.readN(length)
	default:
		err = fmt.Errorf("response without Content-Length or chunked body: %w", errMalformed)
	}
	if err == nil && closing {
		c.nc.Close()
		c.nc = nil
	}
	return status, err
}

func (c *conn) readN(n int) error {
	start := len(c.answer)
	if cap(c.answer)-start < n {
		grown := make([]byte, start, start+n)
		copy(grown, c.answer)
		c.answer = grown
	}
	c.answer = c.answer[:start+n]
	_, err := io.ReadFull(c.r, c.answer[start:])
	return err
}

func (c *conn) readChunks() error {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		text := bytes.TrimSpace(line)
		if i := bytes.IndexByte(text, ';'); i >= 0 {
			text = text[:i]
		}
		size, err := strconv.ParseInt(string(text), 16, 32)
		if err != nil || size < 0 {
			return errMalformed
		}
		if size == 0 { // trailers, then a blank line
			for {
				line, err = c.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(line) <= 2 {
					return nil
				}
			}
		}
		if err := c.readN(int(size)); err != nil {
			return err
		}
		if _, err := c.r.Discard(2); err != nil { // the chunk's CRLF
			return err
		}
	}
}
