"""The outside world's formats and services, below the runtime: settings from the environment
(``config``), the bytes on the wire of both HTTP surfaces (``wire``), S3 (``objectstore``), Prometheus
(``metrics``) and the payload log (``payloadlog``). They use the domain and nothing above it.
"""
