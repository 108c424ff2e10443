"""reembedding definitions (autoloaded): the backfill asset, its coverage check, start/flip/flip back/drop jobs."""
