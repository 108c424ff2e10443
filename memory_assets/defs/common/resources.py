"""Resources every domain shares (see memory_assets/README.md): one SettingsResource, which reads the
environment once per run, held by every resource a run uses (the sensors' alerts read it at their tick). Nothing here reads the environment when the
definitions load: DATABASE_URL and the embedded database come from the run's settings."""

import dagster as dg

from memory_assets.alerts import AlertResource
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SettingsResource,
    SummarizerResource,
)


@dg.definitions
def defs() -> dg.Definitions:
    settings = SettingsResource()
    return dg.Definitions(
        # One process per run, not per step: a step then costs no interpreter start, import of the code
        # location or resource setup of its own (~10 s each under load with the multiprocess
        # executor). The Slow Path's steps run one after another anyway; pools still apply.
        executor=dg.in_process_executor,
        resources={
            # The URL never goes through Dagster config (the UI would show it, with its password): the
            # database resource takes DATABASE_URL from the run's settings.
            "database": DatabaseResource(settings=settings),
            "object_store": ObjectStoreResource(settings=settings),
            "summarizer": SummarizerResource(settings=settings),
            "embedder": EmbedderResource(settings=settings),
            "archival": ArchivalCriteriaResource(settings=settings),
            # Where the sensors' alerts go; bind a subclass here to deliver them another way.
            "alerts": AlertResource(),
        },
    )
