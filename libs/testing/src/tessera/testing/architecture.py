"""A service's layers read from its source, for architecture tests: which module imports what (at run
time, or for type checking too), the modules of a layer, import cycles, and whether importing a layer
loads infrastructure. Every service's `test_architecture`/`test_*_layers` states its rules with it."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SQL = ("sqlalchemy", "asyncpg")
OUTER_LAYERS = ("adapters", "service_layer", "entrypoints", "bootstrap", "config")


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    """`name` is one of `prefixes` or inside one of them (`sqlalchemy.orm` is within `sqlalchemy`)."""
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


class SourceTree:
    """The modules of `package` (``tessera.admission``), by dotted name."""

    def __init__(self, package: str) -> None:
        self.package = package
        root = Path(importlib.import_module(package).__file__ or "").resolve().parent
        self.root = root
        self.modules = {self._name(path): path for path in sorted(root.rglob("*.py"))}
        self._trees: dict[str, ast.Module] = {}

    def _name(self, path: Path) -> str:
        parts = path.relative_to(self.root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join((self.package, *parts))

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.modules[module]
            self._trees[module] = ast.parse(path.read_text(), str(path))
        return self._trees[module]

    def _type_checking_only(self, module: str) -> set[int]:
        """Line numbers of the statements under `if TYPE_CHECKING:`."""
        lines: set[int] = set()
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING",
                "typing.TYPE_CHECKING",
            ):
                for stmt in node.body:
                    lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        return lines

    def imported(self, module: str, *, at_run_time: bool = False) -> Iterator[str]:
        """Every module `module` imports (for type checking too, unless `at_run_time`), and every
        `from x import y` also as `x.y`, relative imports resolved."""
        path = self.modules[module]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        skipped = self._type_checking_only(module) if at_run_time else set()
        for node in ast.walk(self.tree(module)):
            if getattr(node, "lineno", None) in skipped:
                continue
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)

    def internal_imports(self, module: str, *, at_run_time: bool = False) -> set[str]:
        imported = self.imported(module, at_run_time=at_run_time)
        return {name for name in imported if name in self.modules and name != module}

    def layer(self, *names: str) -> list[str]:
        prefixes = tuple(f"{self.package}.{name}" for name in names)
        return [m for m in self.modules if m in prefixes or m.startswith(tuple(f"{p}." for p in prefixes))]

    def outside(self, *names: str) -> list[str]:
        inside = set(self.layer(*names))
        return [m for m in self.modules if m not in inside]

    # -- the rules every service keeps ------------------------------------------------------------

    def sql_imports(self, module: str, *, at_run_time: bool = False) -> set[str]:
        return {n for n in self.imported(module, at_run_time=at_run_time) if within(n, SQL)}

    def impure_domain_imports(self, module: str, infrastructure: tuple[str, ...]) -> set[str]:
        """What a domain module imports (for type checking too) of `infrastructure` (top-level or
        dotted names), tessera.core or the service's outer layers."""
        forbidden = (*infrastructure, "tessera.core", *(f"{self.package}.{name}" for name in OUTER_LAYERS))
        return {name for name in self.imported(module) if within(name, forbidden)}

    def service_layer_reaches_out(self, module: str) -> set[str]:
        """What a service-layer module imports of the entry points or the wiring."""
        outer = (f"{self.package}.entrypoints", f"{self.package}.bootstrap")
        return {name for name in self.internal_imports(module) if within(name, outer)}

    def import_cycle(self, *, at_run_time: bool = True) -> list[str] | None:
        """One import cycle among the package's modules, or None."""
        graph = {module: self.internal_imports(module, at_run_time=at_run_time) for module in self.modules}
        done: set[str] = set()

        def visit(module: str, path: list[str]) -> list[str] | None:
            if module in path:
                return [*path[path.index(module) :], module]
            if module in done:
                return None
            for target in sorted(graph[module]):
                if found := visit(target, [*path, module]):
                    return found
            done.add(module)
            return None

        for module in sorted(graph):
            if found := visit(module, []):
                return found
        return None

    def loaded_by_importing(self, modules: list[str], infrastructure: tuple[str, ...]) -> list[str]:
        """The infrastructure modules a fresh interpreter has loaded after importing `modules`: the
        transitive check (what the libraries they use pull in counts too)."""
        script = (
            "import importlib, json, sys\n"
            f"for name in {sorted(modules)!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {infrastructure!r})))\n"
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        loaded: list[str] = json.loads(result.stdout)
        return loaded
