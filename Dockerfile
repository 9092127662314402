# One image for the data plane and the operator:
#   serve | operator | migrate   (arguments to `python -m workflow_streams.cli`)
# Dependencies install from requirements.lock with hashes (pip --require-hashes), so a rebuild gets the
# same bytes; the project's own code is copied, not built, so nothing unlocked enters the image.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock /tmp/requirements.lock
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --require-hashes --no-deps -r /tmp/requirements.lock

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app/dataplane:/app/operator \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WFS_HOST=0.0.0.0 \
    WFS_PORT=8080
RUN groupadd --system --gid 10001 wfs && useradd --system --uid 10001 --gid wfs --no-create-home wfs
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
COPY dataplane ./dataplane
COPY operator ./operator
COPY migrations ./migrations
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "workflow_streams.cli"]
CMD ["serve"]
