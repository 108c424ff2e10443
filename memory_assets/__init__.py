"""Dagster definitions of memory-archive: thin assets, checks, jobs and schedules over memory_lib."""
