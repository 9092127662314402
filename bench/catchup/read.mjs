// node read.mjs <our stream url> <token> <records>: the protocol's TS client reads <records> JSON
// messages of 100 bytes with live: false, from a stream of ours and from the reference server (in
// memory, loaded with the same messages), best of three each; prints JSON.
import { DurableStreamTestServer } from "@durable-streams/server"
import { stream } from "@durable-streams/client"

const [ours, token, count] = process.argv.slice(2)
const records = Number(count)
const json = { "Content-Type": "application/json" }

async function load(url, headers) {
  const put = await fetch(url, { method: "PUT", headers: { ...headers, ...json } })
  if (put.status !== 201) throw new Error(`PUT ${url}: ${put.status}`)
  const batch = JSON.stringify(Array.from({ length: 1000 }, () => "x".repeat(98)))
  for (let n = 0; n < records; n += 1000) {
    const post = await fetch(url, { method: "POST", headers: { ...headers, ...json }, body: batch })
    if (post.status >= 300) throw new Error(`POST ${url}: ${post.status} ${await post.text()}`)
  }
}

async function best(url, headers) {
  let fastest = Infinity
  let requests = 0
  for (let round = 0; round < 3; round++) {
    let calls = 0
    const counting = (input, init) => { calls++; return fetch(input, init) }
    const start = performance.now()
    const res = await stream({ url, live: false, json: true, headers, fetch: counting })
    const items = await res.json()
    const seconds = (performance.now() - start) / 1000
    if (items.length !== records) throw new Error(`${url}: read ${items.length} of ${records}`)
    if (seconds < fastest) { fastest = seconds; requests = calls }
  }
  return { seconds: Math.round(fastest * 1000) / 1000, requests }
}

const auth = { Authorization: `Bearer ${token}` }
const ourUrl = `${ours}-ts-${Date.now()}`
await load(ourUrl, auth)
const reference = new DurableStreamTestServer({ port: 0, host: "127.0.0.1" })
await reference.start()
try {
  const refUrl = `${reference.url}/v1/stream/history`
  await load(refUrl, {})
  const us = await best(ourUrl, auth)
  const them = await best(refUrl, {})
  console.log(JSON.stringify({ records, ours: us, reference: them, ratio: Math.round((us.seconds / them.seconds) * 1000) / 1000 }))
} finally {
  await reference.stop()
}
