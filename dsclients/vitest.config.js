import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["clients.test.js"],
    // live tails wait out a long-poll (DS_LONG_POLL_TIMEOUT_MS) and TTL tests wait for expiry
    testTimeout: 60000,
    hookTimeout: 30000,
    // one server, many streams: files and tests run one after another, as a user's single process would
    fileParallelism: false,
  },
})
