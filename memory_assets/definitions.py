"""The code location's single entry point: everything under memory_assets/defs/, autoloaded.

Built from the installed `memory_assets.defs` module, not by looking up pyproject.toml's [tool.dg]:
an installed (non-editable) package, as in the Docker image, has no pyproject.toml beside it, and
`dg.load_from_defs_folder` would refuse to load there. Same tree, same definitions in a checkout.
"""

from pathlib import Path

import dagster as dg
from dagster._utils.warnings import suppress_dagster_warnings  # as load_from_defs_folder does

import memory_assets.defs


@dg.definitions
@suppress_dagster_warnings
def defs() -> dg.Definitions:
    return dg.ComponentTree.from_module(
        defs_module=memory_assets.defs, project_root=Path(__file__).resolve().parent.parent
    ).build_defs()
