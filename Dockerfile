# One image for the data plane and the operator:
#   serve | operator | migrate   (arguments to `python -m workflow_streams`)
# Dependencies install from requirements.lock with hashes (pip --require-hashes), so a rebuild gets the
# same bytes; the project's own code is copied, not built, so nothing unlocked enters the image.
# `scripts/image` builds it (offline, from a wheelhouse, on a Debian-made base where no registry answers);
# a plain `docker build .` with registry access works too.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# wheel[s] matches the optional wheelhouse directory `scripts/image` stages next to the lock (the locked
# wheels, downloaded with their hashes); with it the install never touches the network, without it pip
# fetches the same hashed files from the index.
COPY requirements.lock wheel[s] /tmp/build/
RUN set --; if ls /tmp/build/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /tmp/build; fi \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --require-hashes --no-deps "$@" -r /tmp/build/requirements.lock

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="workflow-streams" \
      org.opencontainers.image.description="Durable ordered data streams for workflow runs: data plane and operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app/dataplane:/app/operator \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WFS_HOST=0.0.0.0 \
    WFS_PORT=8080
RUN groupadd --gid 10001 wfs \
    && useradd --no-log-init --uid 10001 --gid wfs --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin wfs
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
COPY dataplane ./dataplane
COPY operator ./operator
COPY migrations ./migrations
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "workflow_streams"]
CMD ["serve"]
