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
- no module but the RQ adapter (``workers/rqcompat.py``) uses a private name of RQ or
  rq-scheduler: imports an underscore name from them, reaches an underscore attribute
  RQ defines on anything but its own ``self`` (a class that is no RQ class), or
  overrides one in a subclass of an RQ class. RQ's names are read from its installed
  source, not imported.
The checker itself is tested on small made-up trees, so that each check can fail.
"""

from __future__ import annotations

import ast
import importlib.metadata
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
ALLOWED: Mapping[str, str] = {
    "vmpool/state/keys.py": (
        "the whole Redis key schema, one method and one layout line per key: its one home"
        " (split, a key's spelling would have two)"
    ),
}


# A reference to the project's history in code or docs.
# (A reference may break across lines, a comment marker between its words.)
HISTORY_RE = re.compile(r"\b(?:[Ii]ssues?|[Ss]essions?)\s+(?:(?:#|--)\s*)?\d+\b")
# The one file where the project's history belongs.
CHANGELOG = "CHANGELOG.md"
# A commit named on the benchmark page: a measurement of the code as it was.
COMMIT_RE = re.compile(r"(?:\bcommit\s+`?|`)[0-9a-f]{7,40}\b")
BENCHMARKS = "docs/benchmarks.md"


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


def benchmark_history(root: Path) -> list[str]:
    """``<line>: <text>`` for each commit named on the benchmark page, which keeps the
    command, the machine and the table of the code as it is (its history is the
    CHANGELOG's)."""
    text = (root / BENCHMARKS).read_text(encoding="utf-8")
    lines = text.splitlines()
    return [
        f"{number}: {lines[number - 1].strip()}"
        for number in sorted({text.count("\n", 0, m.start()) + 1 for m in COMMIT_RE.finditer(text)})
    ]


# -- RQ's private names -----------------------------------------------------------------
# The one module that may use them.
RQ_ADAPTER = "workers.rqcompat"
# RQ's distributions and the package each installs.
RQ_PACKAGES: Mapping[str, str] = {"rq": "rq", "rq-scheduler": "rq_scheduler"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def rq_private_names() -> frozenset[str]:
    """Every underscore name RQ and rq-scheduler define or assign, from their source."""
    names: set[str] = set()
    for distribution, package in RQ_PACKAGES.items():
        root = Path(str(importlib.metadata.distribution(distribution).locate_file(package)))
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return frozenset(name for name in names if _private(name))


def _from_rq(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in RQ_PACKAGES.values()


def _rq_classes(modules: Mapping[str, Module]) -> set[str]:
    """The project's classes (by name) derived from a class of RQ, directly or not."""
    # Each module walked once: the names it imports from RQ, its classes and their bases.
    walked: list[tuple[set[str], list[tuple[str, list[str]]]]] = []
    for module in modules.values():
        rq_names: set[str] = set()
        classes: list[tuple[str, list[str]]] = []
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and _from_rq(node.module):
                rq_names.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                rq_names.update(a.asname or a.name for a in node.names if _from_rq(a.name))
            elif isinstance(node, ast.ClassDef):
                classes.append((node.name, [_root_name(base) for base in node.bases]))
        walked.append((rq_names, classes))
    found: set[str] = set()
    while True:
        before = len(found)
        for rq_names, classes in walked:
            for name, bases in classes:
                if any(base in rq_names or base in found for base in bases):
                    found.add(name)
        if len(found) == before:
            return found


def _root_name(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


class _PrivateUses(ast.NodeVisitor):
    """The uses of RQ's private names in one module (see :func:`rq_private_uses`)."""

    def __init__(self, rq_private: frozenset[str], rq_classes: set[str]) -> None:
        self.rq_private, self.rq_classes = rq_private, rq_classes
        self.classes: list[bool] = []  # per enclosing class: is it an RQ class?
        self.found: list[tuple[int, str]] = []

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names if _from_rq(node.module) else ():
            if _private(alias.name) or any(map(_private, str(node.module).split("."))):
                self.found.append((node.lineno, f"imports {node.module}.{alias.name}"))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _from_rq(alias.name) and any(map(_private, alias.name.split("."))):
                self.found.append((node.lineno, f"imports {alias.name}"))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        is_rq = node.name in self.rq_classes
        for stmt in node.body if is_rq else ():
            targets = [stmt] if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) else []
            names = [t.name for t in targets]
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                aims = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names += [aim.id for aim in aims if isinstance(aim, ast.Name)]
            for name in names:
                if name in self.rq_private:
                    self.found.append((stmt.lineno, f"overrides {node.name}.{name}"))
        self.classes.append(is_rq)
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        own = (
            isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
            and bool(self.classes)
            and not self.classes[-1]
        )
        if node.attr in self.rq_private and not own:
            self.found.append((node.lineno, f"reaches .{node.attr}"))
        self.generic_visit(node)


def rq_private_uses(
    modules: Mapping[str, Module], rq_private: frozenset[str], adapter: str = RQ_ADAPTER
) -> list[str]:
    """``<module>:<line>: <what>`` for each use of a private RQ name outside ``adapter``."""
    rq_classes = _rq_classes(modules)
    problems: list[str] = []
    for module in modules.values():
        if module.name == adapter:
            continue
        uses = _PrivateUses(rq_private, rq_classes)
        uses.visit(module.tree)
        problems += [f"{module.name}:{line}: {what}" for line, what in sorted(uses.found)]
    return problems


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


def test_the_benchmark_page_measures_the_code_as_it_is() -> None:
    """docs/benchmarks.md names no commit: no before/after columns of older code."""
    assert benchmark_history(ROOT) == []


def test_rqs_private_names_are_used_by_the_adapter_alone(project: dict[str, Module]) -> None:
    assert RQ_ADAPTER in project
    assert rq_private_uses(project, rq_private_names()) == []


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


def test_checker_finds_commits_named_on_the_benchmark_page(tmp_path: Path) -> None:
    page = "# B\n\n| before (commit 4dfd85b) | x |\nrun from `7b75f16`, then\nsha256 and ed25519\n"
    _tree(tmp_path, {BENCHMARKS: page})
    assert benchmark_history(tmp_path) == [
        "3: | before (commit 4dfd85b) | x |",
        "4: run from `7b75f16`, then",
    ]


def test_checker_finds_rqs_private_names_outside_the_adapter(tmp_path: Path) -> None:
    rq_private = frozenset({"_secret", "_hook"})
    modules = _tree(
        tmp_path,
        {
            "workers/rqcompat.py": (
                "from rq.scripts import _secret\n"
                "from rq.worker import BaseWorker\n"
                "class Hooks(BaseWorker):\n"
                "    def hook(self):\n"
                "        return super()._hook()\n"
            ),
            "workers/loop.py": (
                "from rq.scripts import _secret\n"
                "import rq._internal\n"
                "from workers.rqcompat import Hooks\n"
                "class Loop(Hooks):\n"
                "    _hook = None\n"
                "    def _secret(self):\n"
                "        return self._hook, self._mine\n"
                "class Own:\n"
                "    def f(self):\n"
                "        return self._hook\n"
                "def g(worker):\n"
                "    return worker._secret\n"
            ),
        },
    )
    assert rq_private_uses(modules, rq_private) == [
        "workers.loop:1: imports rq.scripts._secret",
        "workers.loop:2: imports rq._internal",
        "workers.loop:5: overrides Loop._hook",
        "workers.loop:6: overrides Loop._secret",
        "workers.loop:7: reaches ._hook",
        "workers.loop:12: reaches ._secret",
    ]
