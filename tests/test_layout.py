"""The house's shape, checked from the source (ast; nothing is imported or run).

What this proves, for every module of ``vmpool/`` and ``workers/``:
- it belongs to a layer, and imports only from its own layer or a lower one
  (``cli -> api, local -> workers -> lifecycle -> config -> providers -> state -> ids``:
  docs/architecture.md, "Where things live"); imports made inside functions and under
  ``TYPE_CHECKING`` count too;
- the imports form no cycle (modules, not layers: two modules of one layer may not
  import each other either);
- no module is over :data:`MAX_MODULE_LINES` lines and no function over
  :data:`MAX_FUNCTION_LINES` (docstring included), except the few listed in
  :data:`ALLOWED`, each with its reason.
- no ``.py`` or ``.lua`` file tells history ("issue 15", "session 4"), and neither does
  README.md or a page of ``docs/``: history goes in commit messages and CHANGELOG.md.
The checker itself is tested on small made-up trees, so that each check can fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("vmpool", "workers")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50

# Module-name prefix -> layer; the longest matching prefix wins. Higher imports lower.
LAYERS: Mapping[str, int] = {
    "vmpool": 0,  # the package's face: its version, nothing else
    "vmpool.ids": 0,
    "vmpool.state": 1,
    "vmpool.providers": 2,
    "vmpool.config": 3,
    "vmpool.lifecycle": 4,
    "workers": 5,
    "vmpool.api": 6,
    "vmpool.local": 6,
    "vmpool.cli": 7,
}
# Two tops of one floor that must not lean on each other.
SIBLINGS_APART = frozenset({("vmpool.api", "vmpool.local"), ("vmpool.local", "vmpool.api")})

# "path" or "path:function" -> why it may stay over the limit.
ALLOWED: Mapping[str, str] = {}


# A reference to the project's history in code or docs.
# (A reference may break across lines, a comment marker between its words.)
HISTORY_RE = re.compile(r"\b(?:[Ii]ssues?|[Ss]essions?)\s+(?:(?:#|--)\s*)?\d+\b")
# The one file where the project's history belongs.
CHANGELOG = "CHANGELOG.md"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    lines: int


def load_modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            text = path.read_text(encoding="utf-8")
            name = ".".join(parts)
            modules[name] = Module(name, path, ast.parse(text), len(text.splitlines()))
    return modules


def imports_of(module: Module, known: Mapping[str, Module]) -> set[str]:
    """The project modules ``module`` imports (anywhere in it), resolved to modules:
    ``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found.update(_known_prefix(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else _known_prefix(node.module, known))
    found.discard("")
    found.discard(module.name)
    return found


def _known_prefix(name: str, known: Mapping[str, Module]) -> str:
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def layer_of(name: str) -> tuple[str, int] | None:
    """The layer a module belongs to; the bare ``vmpool`` entry covers only the package's
    own ``__init__``, so a new module straight under ``vmpool/`` is in no layer."""
    best = max(
        (p for p in LAYERS if name == p or (p != "vmpool" and name.startswith(p + "."))),
        key=len,
        default=None,
    )
    return None if best is None else (best, LAYERS[best])


def upward_imports(modules: Mapping[str, Module]) -> list[str]:
    problems: list[str] = []
    for module in modules.values():
        mine = layer_of(module.name)
        if mine is None:
            problems.append(f"{module.name}: in no layer (add it to LAYERS and the docs)")
            continue
        for target in sorted(imports_of(module, modules)):
            theirs = layer_of(target)
            assert theirs is not None, target
            if theirs[1] > mine[1] or (mine[0], theirs[0]) in SIBLINGS_APART:
                problems.append(f"{module.name} ({mine[0]}) imports {target} ({theirs[0]})")
    return problems


def cycles(modules: Mapping[str, Module]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    graph = {name: sorted(imports_of(m, modules)) for name, m in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def oversized(
    modules: Mapping[str, Module], root: Path = ROOT, allowed: Mapping[str, str] = ALLOWED
) -> list[str]:
    """``<path>[:<function>]: N lines (limit L)`` for each thing over its limit."""
    problems: list[str] = []
    for module in modules.values():
        rel = module.path.relative_to(root).as_posix()
        if module.lines > MAX_MODULE_LINES and rel not in allowed:
            problems.append(f"{rel}: {module.lines} lines (limit {MAX_MODULE_LINES})")
        for name, length in _functions(module.tree):
            if length > MAX_FUNCTION_LINES and f"{rel}:{name}" not in allowed:
                problems.append(f"{rel}:{name}: {length} lines (limit {MAX_FUNCTION_LINES})")
    return problems


def _history_in(root: Path, paths: list[Path]) -> list[str]:
    """``<path>:<line>: <text>`` for each history reference in ``paths``."""
    found: list[str] = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for match in HISTORY_RE.finditer(text):
            number = text.count("\n", 0, match.start()) + 1
            found.append(f"{rel}:{number}: {lines[number - 1].strip()}")
    return found


def history_references(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``<path>:<line>: <text>`` for each history reference in the packages' source."""
    paths = [
        path
        for package in packages
        for path in sorted((root / package).rglob("*"))
        if path.suffix in (".py", ".lua")
    ]
    return _history_in(root, paths)


def doc_history_references(root: Path) -> list[str]:
    """``<path>:<line>: <text>`` for each history reference in README.md and docs/
    (CHANGELOG.md, at the root, is where history goes and is not read)."""
    paths = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return _history_in(root, [path for path in paths if path.is_file()])


# -- the project ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def project() -> dict[str, Module]:
    return load_modules(ROOT)


def test_no_upward_import(project: dict[str, Module]) -> None:
    assert upward_imports(project) == []


def test_no_import_cycle(project: dict[str, Module]) -> None:
    assert cycles(project) == []


def test_no_oversized_module_or_function(project: dict[str, Module]) -> None:
    assert oversized(project) == []


def test_allow_list_names_real_oversized_things(project: dict[str, Module]) -> None:
    """An entry that no longer needs its exemption must go (the list stays honest)."""
    over = {line.rsplit(": ", 1)[0] for line in oversized(project, allowed={})}
    for entry in ALLOWED:
        assert entry in over, f"{entry} is within the limits now: drop it from ALLOWED"


def test_no_history_in_code() -> None:
    """No issue or session number in vmpool/ or workers/: history lives in git and
    CHANGELOG.md."""
    assert history_references(ROOT) == []


def test_no_history_in_docs() -> None:
    """No issue or session number in README.md or docs/: they describe the product as it
    is; its history is CHANGELOG.md's."""
    assert (ROOT / CHANGELOG).is_file()
    assert doc_history_references(ROOT) == []


def test_the_domain_never_imports_workers_api_or_cli(project: dict[str, Module]) -> None:
    domain = [
        m
        for m in project.values()
        if m.name.startswith(("vmpool.state", "vmpool.lifecycle", "vmpool.providers"))
    ]
    for module in domain:
        for target in imports_of(module, project):
            assert not target.startswith(("workers", "vmpool.api", "vmpool.cli")), (
                module.name,
                target,
            )


# -- the checker on made-up trees: each check can fail ----------------------------------
def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Module]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return load_modules(tmp_path)


def test_checker_finds_an_upward_import(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "vmpool/__init__.py": "",
            "vmpool/state/__init__.py": "",
            "vmpool/state/store.py": "def f():\n    from vmpool.cli.main import main\n",
            "vmpool/cli/__init__.py": "",
            "vmpool/cli/main.py": "from vmpool.state import store\n",
            "workers/__init__.py": "",
        },
    )
    assert upward_imports(modules) == [
        "vmpool.state.store (vmpool.state) imports vmpool.cli.main (vmpool.cli)"
    ]


def test_checker_finds_a_cycle_inside_one_layer(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "vmpool/__init__.py": "",
            "vmpool/api/__init__.py": "",
            "vmpool/api/app.py": "from vmpool.api.metrics import render\n",
            "vmpool/api/metrics.py": "from vmpool.api import app\n",
            "workers/__init__.py": "",
        },
    )
    assert upward_imports(modules) == []
    assert cycles(modules) == [["vmpool.api.app", "vmpool.api.metrics"]]


def test_checker_finds_long_modules_and_functions(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_module = "\n".join(f"y{i} = {i}" for i in range(MAX_MODULE_LINES + 1))
    modules = _tree(
        tmp_path,
        {
            "vmpool/__init__.py": "",
            "vmpool/ids.py": f"class C:\n    def m(self):\n{body}\n",
            "vmpool/state/__init__.py": long_module,
            "workers/__init__.py": "",
        },
    )
    assert sorted(oversized(modules, tmp_path)) == [
        f"vmpool/ids.py:C.m: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})",
        f"vmpool/state/__init__.py: {MAX_MODULE_LINES + 1} lines (limit {MAX_MODULE_LINES})",
    ]


def test_checker_places_an_unknown_module_nowhere(tmp_path: Path) -> None:
    files = {"vmpool/__init__.py": "", "workers/__init__.py": "", "vmpool/misc.py": ""}
    modules = _tree(tmp_path, files)
    assert upward_imports(modules) == ["vmpool.misc: in no layer (add it to LAYERS and the docs)"]


def test_checker_finds_history_in_python_and_lua(tmp_path: Path) -> None:
    files = {
        "vmpool/a.py": "x = 1  # issue 15: batched\n# the issue is 3 words\n",
        "workers/b.lua": "-- Session 4 measured this (issue\n-- 15)\n",
        "workers/c.txt": "issue 15\n",
    }
    _tree(tmp_path, files)
    assert history_references(tmp_path) == [
        "vmpool/a.py:1: x = 1  # issue 15: batched",
        "workers/b.lua:1: -- Session 4 measured this (issue",
        "workers/b.lua:1: -- Session 4 measured this (issue",
    ]


def test_checker_finds_history_in_readme_and_docs_not_in_the_changelog(tmp_path: Path) -> None:
    files = {
        "README.md": "Fast since Session 5.\n",
        "docs/a.md": "# Batching (issue 15)\n\nthe issue is 3 words\n",
        "docs/deep/b.md": "see issue\n#21\n",
        "docs/c.txt": "issue 15\n",
        CHANGELOG: "## Throughput (issue 15)\n",
    }
    _tree(tmp_path, files)
    assert doc_history_references(tmp_path) == [
        "README.md:1: Fast since Session 5.",
        "docs/a.md:1: # Batching (issue 15)",
        "docs/deep/b.md:1: see issue",
    ]
