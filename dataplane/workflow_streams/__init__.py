"""Durable, strictly ordered data streams for workflow runs."""

API_PREFIX = "/api/workflow-streams"
