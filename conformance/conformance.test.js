// The Durable Streams server conformance suite against the server named by DS_BASE_URL
// (tests/test_durable_conformance.py starts one and reads the JSON report).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({
  baseUrl: process.env.DS_BASE_URL,
  longPollTimeoutMs: Number(process.env.DS_LONG_POLL_TIMEOUT_MS ?? 20000),
})
