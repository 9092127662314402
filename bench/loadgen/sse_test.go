package main

import (
	"bufio"
	"strings"
	"testing"
)

// The checker itself must be able to fail: a duplicate, a gap and the send time are all seen.
func TestFollowCountsDuplicatesAndGaps(t *testing.T) {
	events := []string{
		": heartbeat\n\n",
		"id: 1\nevent: record\ndata: {\"sequence\":1,\"data\":{\"t\":1,\"p\":\"x\"}}\n\n",
		"id: 2\nevent: record\ndata: {\"sequence\":2,\"data\":{\"t\":1}}\n\n",
		"id: 2\nevent: record\ndata: {\"sequence\":2,\"data\":{\"t\":1}}\n\n",  // duplicate
		"id: 5\r\nevent: record\r\ndata: {\"sequence\":5,\"data\":{}}\r\n\r\n", // gap of 2; CRLF; no send time
		"event: close\ndata: {\"last_sequence\":5}\n\n",
	}
	s := &subscriber{lines: bufio.NewReader(strings.NewReader(strings.Join(events, "")))}
	s.follow()
	if s.delivered != 3 || s.duplicates != 1 || s.gaps != 1 || s.skipped != 2 || s.last.Load() != 5 {
		t.Fatalf("delivered %d duplicates %d gaps %d skipped %d last %d",
			s.delivered, s.duplicates, s.gaps, s.skipped, s.last.Load())
	}
	if len(s.latencies) != 2 {
		t.Fatalf("%d latencies, want 2 (records with a send time)", len(s.latencies))
	}
	if !s.ended.Load() || s.endedBy != "event: close" {
		t.Fatalf("ended %v by %q", s.ended.Load(), s.endedBy)
	}
}

func TestAppendBodyHoldsARecordOfTheGivenSize(t *testing.T) {
	body := string(appendBody(100))
	if got := len(body) - len(`{"data":}`); got != 100 {
		t.Fatalf("payload is %d bytes: %s", got, body)
	}
}
