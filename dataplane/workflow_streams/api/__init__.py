"""The HTTP surface under /api/workflow-streams."""
