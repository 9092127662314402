// node serve.mjs [DIR]: the protocol's reference server on a free loopback port, its file store in DIR
// (each append written and fdatasync'ed before it is answered, the appends in flight on a stream
// sharing one fdatasync) or in memory without DIR; prints {"url": ...} once it listens and stops on
// SIGTERM (bench/scenarios.py's durable appends start it as a peer).
import { DurableStreamTestServer, FileBackedStreamStore } from "@durable-streams/server"

const [dataDir] = process.argv.slice(2)
// The server makes its file store with a pool of 100 open segment files. With more streams than that
// taking appends at once (the bench's 1,000), a file is closed between an append's write and its
// fdatasync, and that append answers 404 ("Cannot fsync: handle not found"): measured at 1,000 streams
// x 32 connections, 25,254 of 28,502 appends (0.3.7). The store is made here with a pool above the streams.
const MAX_FILE_HANDLES = 4096
// compression off: our server does not compress either, and the generator does not ask for it
const server = new DurableStreamTestServer({ port: 0, host: "127.0.0.1", compression: false })
if (dataDir) {
  server.store = new FileBackedStreamStore({ dataDir, maxFileHandles: MAX_FILE_HANDLES })
  server.options.dataDir = dataDir
}
await server.start()
console.log(JSON.stringify({ url: server.url, store: dataDir ? "file" : "memory" }))

process.on("SIGTERM", async () => {
  await server.stop()
  process.exit(0)
})
