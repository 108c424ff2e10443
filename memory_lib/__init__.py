"""memory-archive: lifecycle management for AI-agent memory tables in Postgres + pgvector.

Plain Python; never imports dagster, so agent code can use it on its own.
"""

__version__ = "0.1.0"
