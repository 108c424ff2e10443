"""An import-linter contract of this project's: no module imports another module's `_private` names.

import-linter's graph records which module imports which, not the names; this contract reads each
module's `from x import a, _b` statements (those under TYPE_CHECKING too) and flags every name with one
leading underscore taken from another module of the root packages. A name that two modules need is
public in the module that owns it. `make lint` runs it through `lint-imports` (pyproject.toml).
"""

from __future__ import annotations

import ast
import importlib.util

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(module: str, roots: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """(line, imported module, name) for each private name `module` imports from another module."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    is_package = spec.submodule_search_locations is not None
    found = []
    modules: dict[str, str] = {}  # local name -> a module of the root packages bound to it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(roots) and alias.asname:
                    modules[alias.asname] = alias.name
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _resolve(module, is_package, node)
        if source == module or not source.startswith(roots):
            continue
        for alias in node.names:
            name = alias.name
            if _private(name):
                found.append((node.lineno, source, name))
            elif _is_module(f"{source}.{name}"):
                modules[alias.asname or name] = f"{source}.{name}"
    for node in ast.walk(tree):  # `module._name` on a module imported whole
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and modules[node.value.id] != module
            and _private(node.attr)
        ):
            found.append((node.lineno, modules[node.value.id], node.attr))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package: `name` is not a module
        return False


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


class PrivateNamesContract(Contract):
    type_name = "private_names"

    source_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots: tuple[str, ...] = tuple(self.source_modules)  # type: ignore[arg-type]
        violations = []
        for module in sorted(graph.modules):
            if module.startswith(roots):
                for line, source, name in private_imports(module, roots):
                    violations.append(f"{module} (l.{line}) imports {name} from {source}")
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["violations"]:
            output.print_error(f"- {line}")
        output.new_line()
        output.print("Make the name public in the module that owns it, or move the code that needs it there.")
