"""The scale benchmark of issue 14: background work at a million streams (``python -m bench.scale``)."""
