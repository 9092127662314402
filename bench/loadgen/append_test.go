package main

import (
	"encoding/json"
	"testing"
)

// A batch is n records, each the same JSON string of -size bytes as a single append's.
func TestBatchBodyHoldsNRecordsOfSize(t *testing.T) {
	var single struct{ Data json.RawMessage }
	if err := json.Unmarshal(appendBody(100), &single); err != nil || len(single.Data) != 100 {
		t.Fatalf("single append: %v, %d bytes", err, len(single.Data))
	}
	var batch struct {
		Records []struct{ Data json.RawMessage }
	}
	if err := json.Unmarshal(batchBody(100, 10), &batch); err != nil || len(batch.Records) != 10 {
		t.Fatalf("batch: %v, %d records", err, len(batch.Records))
	}
	for _, r := range batch.Records {
		if len(r.Data) != 100 {
			t.Fatalf("a record of %d bytes", len(r.Data))
		}
	}
}

// On the durable surface a request is the record's bytes themselves, and a batch is refused.
func TestDurableBodyIsTheRawRecord(t *testing.T) {
	d := &target{surface: "durable"}
	if body, err := requestBody(d, 100, 1); err != nil || len(body) != 100 || body[0] != 'x' {
		t.Fatalf("durable body %q, %v", body, err)
	}
	if _, err := requestBody(d, 100, 10); err == nil {
		t.Fatal("a durable batch was accepted")
	}
}
