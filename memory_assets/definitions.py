"""The code location's single entry point: everything under memory_assets/defs/, autoloaded."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
