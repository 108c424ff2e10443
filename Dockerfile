# The memory-archive Dagster code location: a non-editable install of the package with every
# dependency pinned (deploy/constraints.txt, the versions the tests ran on). Build and push with a
# fixed tag, then point the deployment at it (deploy/README.md):
#   docker build -t registry.example.com/memory-archive:0.1.0 .
#   docker run -e DATABASE_URL=... -e MEMORY_ARCHIVE_BUCKET=... -e ANTHROPIC_API_KEY=... -p 4000:4000 \
#     registry.example.com/memory-archive:0.1.0
# The instance's dagster.yaml (storage, run queue, the llm_api pool) belongs to the webserver and the
# daemon (deploy/dagster.yaml, or the Helm chart's values), not to this image: limits set in a code
# server have no effect.
# Pin the base image by digest in your CI (python:3.11-slim-bookworm@sha256:...) for a reproducible build.
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MEMORY_ARCHIVE_STATE_DIR=/var/lib/memory-archive

WORKDIR /src
COPY pyproject.toml README.md ./
COPY memory_lib memory_lib
COPY memory_assets memory_assets
# memory_lib/sql is a symlink to sql/: the build follows it, so the migrations ship in the package.
COPY sql sql
COPY deploy/constraints.txt deploy/constraints.txt
# Not editable: the code location runs from site-packages, exactly what was built; /src is removed.
RUN pip install --constraint deploy/constraints.txt ".[all]" \
    && cd / && rm -rf /src \
    && useradd --create-home --uid 10001 memory \
    && mkdir -p /var/lib/memory-archive \
    && chown -R memory /var/lib/memory-archive

USER memory
WORKDIR /home/memory
EXPOSE 4000
# memory_assets.code_server pins the first archival night to the oldest memory's (when
# MEMORY_ARCHIVE_PARTITION_START is unset), then execs `python -m dagster code-server start ... -m memory_assets.definitions`.
CMD ["python", "-m", "memory_assets.code_server", "-h", "0.0.0.0", "-p", "4000"]
