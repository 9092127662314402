// The Durable Streams protocol's own TypeScript client (@durable-streams/client) and its state package
// (@durable-streams/state, with @tanstack/db) against the server named by DS_BASE_URL.
// tests/test_durable_clients.py starts plain `workflow-streams dev`, runs this file under vitest and
// reads the JSON report: every test here is one operation of the clients, checked against what the
// server stored (plain fetch GETs of the same stream), not only against what the client says.
import { randomUUID } from "node:crypto"
import { describe, expect, test, beforeAll } from "vitest"
import {
  DurableStream,
  FetchError,
  IdempotentProducer,
  StaleEpochError,
  stream,
} from "@durable-streams/client"
import { MaterializedState, createStateSchema, isChangeEvent } from "@durable-streams/state"
import { createStreamDB } from "@durable-streams/state/db"

const BASE = process.env.DS_BASE_URL
if (!BASE) throw new Error("DS_BASE_URL names the server's Durable Streams prefix")
const LONG_POLL_MS = Number(process.env.DS_LONG_POLL_TIMEOUT_MS ?? 10000)
const RUN = randomUUID().slice(0, 8)
const JSON_TYPE = "application/json"
let streams = 0

/** A fresh stream URL of this run. */
function urlFor(label) {
  streams += 1
  return `${BASE}/v1/stream/ts-${label}-${RUN}-${streams}`
}

/** Our offsets: the sequence of the last record, zero-padded to 20 digits. */
const off = (n) => String(n).padStart(20, "0")
const numbers = (from, to) => Array.from({ length: to - from }, (_, i) => ({ i: from + i }))

/** What the server holds, read with a plain GET (not the client under test). */
async function stored(url, offset = "-1") {
  const response = await fetch(`${url}?offset=${offset}`)
  expect(response.status).toBe(200)
  return {
    items: await response.json(),
    next: response.headers.get("stream-next-offset"),
    closed: response.headers.get("stream-closed") === "true",
  }
}

/** Appends with a plain POST (setup, not the client under test); the tail offset after it. */
async function post(url, items) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": JSON_TYPE },
    body: JSON.stringify(items),
  })
  expect([200, 204]).toContain(response.status)
  return response.headers.get("stream-next-offset")
}

/** Polls until the condition holds (tests never sleep and then assert). */
async function eventually(condition, { within = 15000, interval = 50, message = "condition not reached" } = {}) {
  const deadline = Date.now() + within
  for (;;) {
    const value = await condition()
    if (value) return value
    if (Date.now() >= deadline) throw new Error(`${message} (waited ${within} ms)`)
    await new Promise((resolve) => setTimeout(resolve, interval))
  }
}

/** A fetch that records every request the client makes and the answer's status. */
function recordingFetch() {
  const log = []
  const recorded = async (input, init) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url
    const entry = { method: init?.method ?? "GET", url, status: undefined, contentType: undefined }
    log.push(entry)
    const response = await fetch(input, init)
    entry.status = response.status
    entry.contentType = response.headers.get("content-type")
    return response
  }
  return { fetch: recorded, log }
}

/**
 * The error a client call rejected with. Client 0.2.7 wraps its handle's fetch in a retry layer that
 * throws FetchError for any 4xx before the handle's own mapping (StreamClosedError, DurableStreamError
 * with a code) runs, so refusals arrive as FetchError with the server's status and headers.
 */
async function rejection(promise) {
  try {
    await promise
  } catch (error) {
    return error
  }
  throw new Error("the call did not fail")
}

/** A Standard Schema validator for the state tests (no validation library needed). */
function shape(fields) {
  return {
    "~standard": {
      version: 1,
      vendor: "workflow-streams-test",
      validate: (value) =>
        value && typeof value === "object" && fields.every((field) => typeof value[field] === "string")
          ? { value }
          : { issues: [{ message: `needs string fields ${fields.join(", ")}` }] },
    },
  }
}

async function created(label, options = {}) {
  const url = urlFor(label)
  const handle = await DurableStream.create({ url, contentType: JSON_TYPE, ...options })
  return { url, handle }
}

describe("create", () => {
  test("PUT creates an empty JSON stream; the same PUT again is idempotent; a different one is refused", async () => {
    const url = urlFor("create")
    expect(await DurableStream.head({ url })).toEqual({ exists: false })

    const handle = await DurableStream.create({ url, contentType: JSON_TYPE })
    expect(handle.contentType).toBe(JSON_TYPE)
    const head = await handle.head()
    expect(head).toMatchObject({ exists: true, offset: off(0), streamClosed: false })
    expect(head.contentType).toMatch(/^application\/json/)
    expect(await stored(url)).toEqual({ items: [], next: off(0), closed: false })

    await DurableStream.create({ url, contentType: JSON_TYPE })
    const conflict = await rejection(DurableStream.create({ url, contentType: "text/plain" }))
    expect(conflict).toBeInstanceOf(FetchError)
    expect(conflict.status).toBe(409)
    expect(await stored(url)).toEqual({ items: [], next: off(0), closed: false })
  })

  test("a stream created with a body and closed holds that body and is closed", async () => {
    const url = urlFor("create-closed")
    await DurableStream.create({ url, contentType: JSON_TYPE, body: JSON.stringify([{ done: true }]), closed: true })
    expect(await stored(url)).toEqual({ items: [{ done: true }], next: off(1), closed: true })
    expect(await DurableStream.head({ url })).toMatchObject({ exists: true, streamClosed: true, offset: off(1) })
  })
})

describe("append", () => {
  test("single appends store one message each, in order", async () => {
    const { url, handle } = await created("append-one")
    await handle.append(JSON.stringify({ n: 1 }))
    expect(await stored(url)).toEqual({ items: [{ n: 1 }], next: off(1), closed: false })
    await handle.append(JSON.stringify({ n: 2, text: "zwei ✓" }))
    expect(await stored(url)).toEqual({ items: [{ n: 1 }, { n: 2, text: "zwei ✓" }], next: off(2), closed: false })
    expect((await handle.head()).offset).toBe(off(2))
  })

  test("200 concurrent appends through the batching handle are stored once each, in call order", async () => {
    const url = urlFor("append-batched")
    const recorder = recordingFetch()
    const handle = await DurableStream.create({ url, contentType: JSON_TYPE, fetch: recorder.fetch })
    await Promise.all(numbers(0, 200).map((item) => handle.append(JSON.stringify(item))))
    expect(await stored(url)).toEqual({ items: numbers(0, 200), next: off(200), closed: false })
    const posts = recorder.log.filter((entry) => entry.method === "POST")
    // the client batched concurrent appends into JSON arrays, which the server flattened one level
    expect(posts.length).toBeGreaterThan(1)
    expect(posts.length).toBeLessThan(200)
    expect(posts.every((entry) => entry.status >= 200 && entry.status < 300)).toBe(true)
  })

  test("100 concurrent appends without batching (one POST each) are stored once each", async () => {
    const url = urlFor("append-concurrent")
    await DurableStream.create({ url, contentType: JSON_TYPE })
    const recorder = recordingFetch()
    const handle = new DurableStream({ url, contentType: JSON_TYPE, batching: false, fetch: recorder.fetch })
    await Promise.all(numbers(0, 100).map((item) => handle.append(JSON.stringify(item))))
    expect(recorder.log.filter((entry) => entry.method === "POST" && entry.status === 204)).toHaveLength(100)
    const { items, next } = await stored(url)
    expect(next).toBe(off(100))
    expect(items).toHaveLength(100)
    expect([...items].sort((a, b) => a.i - b.i)).toEqual(numbers(0, 100))
  })
})

describe("idempotent producer", () => {
  test("500 pipelined appends arrive exactly once, in order; close with a final message closes the stream", async () => {
    const { url, handle } = await created("producer")
    const errors = []
    const producer = new IdempotentProducer(handle, "writer-1", {
      lingerMs: 1,
      maxBatchBytes: 512,
      onError: (error) => errors.push(error),
    })
    for (const item of numbers(0, 500)) producer.append(JSON.stringify(item))
    await producer.flush()
    expect(errors).toEqual([])
    expect(producer.nextSeq).toBeGreaterThan(1) // several batches went out, pipelined
    expect(await stored(url)).toEqual({ items: numbers(0, 500), next: off(500), closed: false })

    const result = await producer.close(JSON.stringify({ i: 500 }))
    expect(result.finalOffset).toBe(off(501))
    expect(await stored(url)).toEqual({ items: numbers(0, 501), next: off(501), closed: true })
    expect(errors).toEqual([])
  })

  test("a restarted producer's replays are deduplicated; a higher epoch fences the old one", async () => {
    const { url, handle } = await created("producer-epochs")
    const sendEach = async (producer, items) => {
      for (const item of items) {
        producer.append(JSON.stringify(item))
        await producer.flush() // one batch (one producer sequence number) per message
      }
    }
    const first = new IdempotentProducer(handle, "writer-2", { epoch: 0 })
    await sendEach(first, numbers(0, 10))
    expect(await stored(url)).toEqual({ items: numbers(0, 10), next: off(10), closed: false })

    // the same producer after a crash: epoch 0 again, sequence from 0; its retries are duplicates
    const replay = recordingFetch()
    const again = new IdempotentProducer(handle, "writer-2", { epoch: 0, fetch: replay.fetch })
    await sendEach(again, numbers(0, 10))
    expect(replay.log.map((entry) => entry.status)).toEqual(Array(10).fill(204))
    expect(await stored(url)).toEqual({ items: numbers(0, 10), next: off(10), closed: false })
    await sendEach(again, numbers(10, 11)) // new sequence number: stored
    expect(await stored(url)).toEqual({ items: numbers(0, 11), next: off(11), closed: false })

    // a newer epoch takes over; the old one is fenced (403, StaleEpochError) and stores nothing
    const newer = new IdempotentProducer(handle, "writer-2", { epoch: 1 })
    await sendEach(newer, numbers(11, 12))
    const fencedErrors = []
    const fenced = new IdempotentProducer(handle, "writer-2", { epoch: 0, onError: (e) => fencedErrors.push(e) })
    fenced.append(JSON.stringify({ i: "stale" }))
    await fenced.flush().catch(() => undefined)
    await eventually(() => fencedErrors.length > 0, { message: "the stale producer heard nothing" })
    expect(fencedErrors[0]).toBeInstanceOf(StaleEpochError)
    expect(fencedErrors[0].currentEpoch).toBe(1)

    // autoClaim: on 403 the producer claims the next epoch and its message is stored
    const claimer = new IdempotentProducer(handle, "writer-2", { epoch: 0, autoClaim: true })
    await sendEach(claimer, numbers(12, 13))
    expect(claimer.epoch).toBe(2)
    expect(await stored(url)).toEqual({ items: numbers(0, 13), next: off(13), closed: false })
  })
})

describe("catch-up reads (live: false) of a 2,000-record stream", () => {
  let url
  let after500
  beforeAll(async () => {
    url = urlFor("catchup")
    await DurableStream.create({ url, contentType: JSON_TYPE })
    after500 = await post(url, numbers(0, 500))
    for (let from = 500; from < 2000; from += 500) await post(url, numbers(from, from + 500))
    expect(after500).toBe(off(500))
  })

  test("from the start: all 2,000 records, in order, and the tail offset", async () => {
    const res = await stream({ url, live: false })
    expect(await res.json()).toEqual(numbers(0, 2000))
    expect(res.offset).toBe(off(2000))
    expect(res.upToDate).toBe(true)

    const items = []
    const again = await stream({ url, offset: "-1", live: false })
    for await (const item of again.jsonStream()) items.push(item)
    expect(items).toEqual(numbers(0, 2000))
  })

  test("from an offset the server gave: the 1,500 records after it", async () => {
    const res = await stream({ url, offset: after500, live: false })
    expect(await res.json()).toEqual(numbers(500, 2000))
    expect(res.offset).toBe(off(2000))

    const last = await stream({ url, offset: off(1999), live: false })
    expect(await last.json()).toEqual([{ i: 1999 }])
    const none = await stream({ url, offset: off(2000), live: false })
    expect(await none.json()).toEqual([])
    expect(none.upToDate).toBe(true)
  })
})

/** Reads `url` live in `mode` from `offset`; collects items and batch offsets until cancelled. */
async function tail(url, offset, mode) {
  const recorder = recordingFetch()
  const res = await stream({ url, offset, live: mode, fetch: recorder.fetch })
  const items = []
  const batches = []
  res.subscribeJson(async (batch) => {
    items.push(...batch.items)
    batches.push({ count: batch.items.length, offset: batch.offset, upToDate: batch.upToDate, closed: batch.streamClosed })
  })
  return { res, items, batches, log: recorder.log }
}

describe("live tail", () => {
  test("long-poll: catches up, waits out a 204, then receives each new append", async () => {
    const { url, handle } = await created("tail-longpoll")
    await post(url, numbers(0, 2))
    const reader = await tail(url, "-1", "long-poll")
    try {
      await eventually(() => reader.items.length === 2)
      // a long-poll with nothing new answers 204 after the server's wait; the client polls again
      await eventually(
        () => reader.log.some((entry) => entry.status === 204 && entry.url.includes("live=long-poll")),
        { within: LONG_POLL_MS * 3, message: "no long-poll ran out" },
      )
      for (const item of numbers(2, 5)) {
        await handle.append(JSON.stringify(item))
        await eventually(() => reader.items.length === item.i + 1, { message: `item ${item.i} not delivered` })
      }
      expect(reader.items).toEqual(numbers(0, 5))
      expect(reader.batches.at(-1)).toMatchObject({ offset: off(5), closed: false })
      // every answered request was a GET with 200 or 204 (the last long-poll is still open: no status yet)
      const answered = reader.log.filter((entry) => entry.status !== undefined)
      expect(answered.every((entry) => entry.method === "GET" && [200, 204].includes(entry.status))).toBe(true)
    } finally {
      reader.res.cancel()
    }
  })

  test("SSE: catches up, then receives each new append over one event stream", async () => {
    const { url, handle } = await created("tail-sse")
    await post(url, numbers(0, 2))
    const reader = await tail(url, "-1", "sse")
    try {
      await eventually(() => reader.items.length === 2)
      for (const item of numbers(2, 5)) {
        await handle.append(JSON.stringify(item))
        await eventually(() => reader.items.length === item.i + 1, { message: `item ${item.i} not delivered` })
      }
      expect(reader.items).toEqual(numbers(0, 5))
      expect(reader.batches.at(-1)).toMatchObject({ offset: off(5), upToDate: true, closed: false })
      const sse = reader.log.filter((entry) => entry.url.includes("live=sse"))
      expect(sse.length).toBeGreaterThan(0)
      expect(sse[0]).toMatchObject({ status: 200 })
      expect(sse[0].contentType).toMatch(/^text\/event-stream/)
    } finally {
      reader.res.cancel()
    }
  })
})

describe("resume", () => {
  test("a new session from a saved offset reads exactly what came after it", async () => {
    const { url, handle } = await created("resume")
    await post(url, numbers(0, 3))
    const first = await stream({ url, live: false })
    expect(await first.json()).toEqual(numbers(0, 3))
    const saved = first.offset
    expect(saved).toBe(off(3))

    await post(url, numbers(3, 5))
    const resumed = await stream({ url, offset: saved, live: false })
    expect(await resumed.json()).toEqual(numbers(3, 5))

    // a checkpoint taken from a live subscriber's batch, then a new live session from it
    const reader = await tail(url, "-1", "long-poll")
    let checkpoint
    try {
      await eventually(() => reader.items.length === 5)
      checkpoint = reader.batches.at(-1).offset
    } finally {
      reader.res.cancel()
    }
    expect(checkpoint).toBe(off(5))
    await handle.append(JSON.stringify({ i: 5 }))
    await handle.append(JSON.stringify({ i: 6 }))
    const later = await tail(url, checkpoint, "sse")
    try {
      await eventually(() => later.items.length === 2)
      await handle.append(JSON.stringify({ i: 7 }))
      await eventually(() => later.items.length === 3)
      expect(later.items).toEqual(numbers(5, 8))
    } finally {
      later.res.cancel()
    }
  })
})

describe("close", () => {
  test("close() ends the stream at its tail: HEAD says closed, appends are refused, data stays readable", async () => {
    const { url, handle } = await created("close")
    await post(url, numbers(0, 2))
    const result = await handle.close()
    expect(result.finalOffset).toBe(off(2))
    expect(await handle.head()).toMatchObject({ exists: true, streamClosed: true, offset: off(2) })
    // PROTOCOL.md: an append to a closed stream is 409 with Stream-Closed: true
    const refused = await rejection(handle.append(JSON.stringify({ i: 2 })))
    expect(refused).toMatchObject({ status: 409, headers: { "stream-closed": "true", "stream-next-offset": off(2) } })
    expect(await stored(url)).toEqual({ items: numbers(0, 2), next: off(2), closed: true })
    expect((await handle.close()).finalOffset).toBe(off(2)) // idempotent without a body
    const again = await rejection(handle.close({ body: JSON.stringify({ i: 2 }) }))
    expect(again).toMatchObject({ status: 409, headers: { "stream-closed": "true" } })
    expect(await stored(url)).toEqual({ items: numbers(0, 2), next: off(2), closed: true })

    // a live reader of a closed stream gets everything, sees the end, and stops by itself
    const reader = await tail(url, "-1", "long-poll")
    await eventually(() => reader.batches.some((batch) => batch.closed))
    await reader.res.closed
    expect(reader.items).toEqual(numbers(0, 2))
    expect(reader.batches.at(-1)).toMatchObject({ closed: true, offset: off(2) })
  })

  test("close with a final message releases live readers waiting at the tail (long-poll and SSE)", async () => {
    const { url, handle } = await created("close-live")
    await post(url, numbers(0, 1))
    const polling = await tail(url, off(1), "long-poll")
    const sse = await tail(url, off(1), "sse")
    await eventually(() => polling.log.length > 0 && sse.log.length > 0)
    const result = await handle.close({ body: JSON.stringify({ i: 1 }) })
    expect(result.finalOffset).toBe(off(2))
    // the session ends (res.closed) before the subscriber is handed the last batch: wait for that batch
    await eventually(() => [polling, sse].every((reader) => reader.batches.some((batch) => batch.closed)))
    await Promise.all([polling.res.closed, sse.res.closed])
    for (const reader of [polling, sse]) {
      expect(reader.items).toEqual([{ i: 1 }])
      expect(reader.batches.at(-1)).toMatchObject({ closed: true, offset: off(2) })
    }
    expect(await stored(url)).toEqual({ items: numbers(0, 2), next: off(2), closed: true })
  })
})

describe("delete", () => {
  test("delete() removes the stream; reads and appends are 404; the name can be created anew", async () => {
    const { url, handle } = await created("delete")
    await post(url, numbers(0, 3))
    await handle.delete()
    expect(await handle.head()).toEqual({ exists: false })
    expect((await fetch(`${url}?offset=-1`)).status).toBe(404)
    await expect(stream({ url, live: false })).rejects.toMatchObject({ status: 404 })
    await expect(handle.append(JSON.stringify({ i: 3 }))).rejects.toMatchObject({ status: 404 })
    await expect(handle.delete()).rejects.toMatchObject({ status: 404 })

    await DurableStream.create({ url, contentType: JSON_TYPE })
    expect(await stored(url)).toEqual({ items: [], next: off(0), closed: false })
  })
})

describe("TTL", () => {
  test("a stream created with ttlSeconds is gone once it expires", async () => {
    const { url, handle } = await created("ttl", { ttlSeconds: 3 })
    const head = await fetch(url, { method: "HEAD" })
    expect(head.status).toBe(200)
    expect(head.headers.get("stream-ttl")).toBe("3")
    await handle.append(JSON.stringify({ i: 0 }))
    expect((await stored(url)).items).toEqual([{ i: 0 }])
    // HEAD does not renew a TTL (reads and writes do), so polling with it lets the stream expire
    await eventually(async () => !(await DurableStream.head({ url })).exists, {
      interval: 200,
      message: "the stream did not expire",
    })
    expect((await fetch(`${url}?offset=-1`)).status).toBe(404)
    await expect(stream({ url, live: false })).rejects.toMatchObject({ status: 404 })
  })

  test("a stream created with expiresAt is gone after that instant", async () => {
    const expiresAt = new Date(Date.now() + 3000).toISOString()
    const { url, handle } = await created("expires", { expiresAt })
    const head = await fetch(url, { method: "HEAD" })
    expect(head.headers.get("stream-expires-at")).toBeTruthy()
    await handle.append(JSON.stringify({ i: 0 }))
    await eventually(async () => !(await DurableStream.head({ url })).exists, {
      interval: 200,
      message: "the stream did not expire",
    })
    expect((await fetch(`${url}?offset=-1`)).status).toBe(404)
  })
})

describe("materialized state (@durable-streams/state)", () => {
  const schema = createStateSchema({
    users: { schema: shape(["id", "name"]), type: "user", primaryKey: "id" },
    tasks: { schema: shape(["id", "title"]), type: "task", primaryKey: "id" },
  })
  const history = [
    schema.users.insert({ value: { id: "u1", name: "Ada" } }),
    schema.users.insert({ value: { id: "u2", name: "Grace" } }),
    schema.tasks.insert({ value: { id: "t1", title: "write" } }),
    schema.users.update({ value: { id: "u1", name: "Ada L." }, oldValue: { id: "u1", name: "Ada" } }),
    schema.users.delete({ key: "u2", oldValue: { id: "u2", name: "Grace" } }),
  ]

  /** A collection's rows by key, without TanStack DB's virtual `$…` fields and the sync's `_seq`. */
  function rows(collection) {
    return Object.fromEntries(
      [...collection.entries()].map(([key, row]) => [
        key,
        Object.fromEntries(Object.entries(row).filter(([field]) => !field.startsWith("$") && field !== "_seq")),
      ]),
    )
  }

  async function stateStream(label) {
    const { url, handle } = await created(label)
    for (const event of history) await handle.append(JSON.stringify(event))
    expect((await stored(url)).next).toBe(off(history.length))
    return { url, handle }
  }

  test("MaterializedState applies the change events the client reads back", async () => {
    const { url } = await stateStream("state-plain")
    const events = await (await stream({ url, live: false })).json()
    expect(events).toEqual(history)
    const state = new MaterializedState()
    state.applyBatch(events.filter(isChangeEvent))
    expect(state.get("user", "u1")).toEqual({ id: "u1", name: "Ada L." })
    expect(state.get("user", "u2")).toBeUndefined()
    expect([...state.getType("user").keys()]).toEqual(["u1"])
    expect(state.get("task", "t1")).toEqual({ id: "t1", title: "write" })
  })

  test.each(["long-poll", "sse"])(
    "StreamDB (%s) materializes collections, follows live changes and confirms an optimistic action",
    async (live) => {
      const { url, handle } = await stateStream(`state-db-${live}`)
      const db = createStreamDB({
        streamOptions: { url, contentType: JSON_TYPE },
        state: schema,
        live,
        actions: ({ db, stream: writer }) => ({
          rename: {
            onMutate: ({ id, name }) => {
              db.collections.users.update(id, (draft) => {
                draft.name = name
              })
            },
            mutationFn: async ({ id, name }) => {
              const txid = randomUUID()
              await writer.append(JSON.stringify(schema.users.update({ value: { id, name }, headers: { txid } })))
              await db.utils.awaitTxId(txid, 15000)
            },
          },
        }),
      })
      try {
        await db.preload()
        expect(db.offset).toBe(off(history.length))
        expect(rows(db.collections.users)).toEqual({ u1: { id: "u1", name: "Ada L." } })
        expect(rows(db.collections.tasks)).toEqual({ t1: { id: "t1", title: "write" } })

        // another writer's change, confirmed by its transaction id once the live read delivers it
        const txid = randomUUID()
        await handle.append(JSON.stringify(schema.users.insert({ value: { id: "u3", name: "Edsger" }, headers: { txid } })))
        await db.utils.awaitTxId(txid, 15000)
        expect(rows(db.collections.users)).toEqual({
          u1: { id: "u1", name: "Ada L." },
          u3: { id: "u3", name: "Edsger" },
        })

        // an optimistic action: applied at once, persisted through the stream, confirmed by the live read
        const transaction = db.actions.rename({ id: "u1", name: "Ada Lovelace" })
        await transaction.isPersisted.promise
        expect(rows(db.collections.users).u1).toEqual({ id: "u1", name: "Ada Lovelace" })
        const { items, next } = await stored(url)
        expect(next).toBe(off(history.length + 2))
        expect(items.at(-1)).toMatchObject({ type: "user", key: "u1", value: { id: "u1", name: "Ada Lovelace" } })
        expect(db.offset).toBe(off(history.length + 2))
      } finally {
        db.close()
      }
    },
  )
})
