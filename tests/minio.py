"""MinIO for the tests: the package's launcher (``workflow-streams dev`` runs the same one)."""

from __future__ import annotations

from workflow_streams.local.minio import ACCESS_KEY, SECRET_KEY, MinioServer, minio_binary

__all__ = ["ACCESS_KEY", "SECRET_KEY", "MinioServer", "minio_binary"]
