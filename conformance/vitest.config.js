import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["conformance.test.js"],
    // the suite's own tests without a timeout of theirs wait for long-polls and TTL expiry
    testTimeout: 30000,
    hookTimeout: 30000,
  },
})
