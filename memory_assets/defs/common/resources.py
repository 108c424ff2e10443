"""Resources every domain shares, bound from the environment (see memory_assets/README.md)."""

import os

import dagster as dg

from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.config import Settings


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(
        resources={
            # An EnvVar: the UI shows the variable's name, never the URL (it may hold a password).
            "database": DatabaseResource(
                database_url=dg.EnvVar("DATABASE_URL") if os.getenv("DATABASE_URL") else None,
                embedded_database=Settings.from_env().embedded_database,
            ),
            "object_store": ObjectStoreResource(),
            "summarizer": SummarizerResource(),
            "embedder": EmbedderResource(),
            "archival": ArchivalCriteriaResource(),
        }
    )
