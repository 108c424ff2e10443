# A Dagster code location for memory-archive. Point it at your own Postgres and bucket:
#   docker build -t memory-archive .
#   docker run -e DATABASE_URL=... -e MEMORY_ARCHIVE_BUCKET=... -e ANTHROPIC_API_KEY=... -p 4000:4000 memory-archive
# and load it from your Dagster deployment's workspace.yaml as a grpc_server on port 4000.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MEMORY_ARCHIVE_STATE_DIR=/var/lib/memory-archive \
    DAGSTER_HOME=/var/lib/memory-archive/dagster

RUN useradd --create-home --uid 10001 memory \
    && mkdir -p /var/lib/memory-archive/dagster \
    && chown -R memory /var/lib/memory-archive

WORKDIR /app
COPY pyproject.toml README.md ./
COPY memory_lib memory_lib
COPY memory_assets memory_assets
COPY sql sql
COPY workspace.yaml dagster.yaml ./
# The migrations ship in the package (memory_lib/sql is a symlink to sql/, copied above).
RUN pip install -e . && cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

USER memory
EXPOSE 4000
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "memory_assets.definitions"]
