"""Resources every domain shares, bound from the environment (see memory_assets/README.md)."""

import os

import dagster as dg

from memory_assets.alerts import AlertResource
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.core.config import Settings


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(
        # One process per run, not per step: a step then costs no interpreter start, import of the code
        # location or resource setup of its own (~10 s each under load with the multiprocess
        # executor). The Slow Path's steps run one after another anyway; pools still apply.
        executor=dg.in_process_executor,
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
            # Where the sensors' alerts go; bind a subclass here to deliver them another way.
            "alerts": AlertResource(),
        },
    )
