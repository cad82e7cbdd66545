"""The house rules of DESIGN.md, checked on the source: every module has a layer, no module
imports one of a higher layer, and there is no import circle, counting every import: at
module level, under `if TYPE_CHECKING:` and inside function bodies.

One upward edge is allowed (`ALLOWED`): the `Dataset` reaching above its layer lazily, from
inside its methods, to start its runtime (`loader()`, `ds[i]`, `len(ds)`, `graph()`, as
Grain's datasets do) and to open the files it was asked to read now
(`from_arrayrecord(decode="auto")`, `from_source(ArrayRecordSource)`).

The layers are the package's folders, ranked lowest first in `LAYERS` (plus the few leaf
modules at its top); a module's rank is that of the longest name it starts with. Within one
layer, modules may import each other, but never in a circle.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import aioloader

ROOT = Path(aioloader.__file__).parent

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the ArrayRecord format: bytes in, bytes out (its errors are the package's base errors)
    ("arrayrecord", ("arrayrecord",)),
    # record formats over it (ArrayRecord's adapter, TFRecord, ...): each format's index and
    # chunk decoding, bytes in and out; they import only the ArrayRecord layer
    ("formats", ("formats",)),
    # leaves: error types, typed settings (`RetryPolicy` among them), logging, URL handling,
    # argument checks, and helpers of the standard library only
    ("leaves", ("errors", "options", "logs", "urls", "arguments", "mounts", "preimport",
                "_moved")),
    ("index", ("index",)),  # pure index algorithms: a position in, a position out
    ("elements", ("elements",)),  # what runs on elements: transforms, collation, packing
    ("describe", ("describe",)),  # the description and its compilation (pure)
    ("io", ("io",)),  # the byte path's stores: retry and hedges, the gate, the loop bridge
    ("cache", ("cache",)),
    ("source", ("source",)),
    ("workers", ("workers",)),
    # device placement: the loader calls it (`to_jax`), it imports nothing of the runtime
    ("jax", ("jax",)),
    ("runtime", ("runtime",)),
    # tools and integrations on top, and the package's public names
    ("tools", ("tools", "beam", "testing", "__main__", "")),
)
RANK = {("aioloader." + name).rstrip("."): rank
        for rank, (_, names) in enumerate(LAYERS) for name in names}
#: what may sit at the top of the package, beside the layer folders
LOOSE = {"__init__", "__main__", "errors", "options", "logs", "urls", "arguments",
         "mounts", "preimport", "_moved", "jax"}

# The one upward edge: the Dataset starting its runtime (and opening its files) from inside
# its methods; a module-level import along it is refused all the same. `loader()`'s return
# type is the `Loader` itself, named under `TYPE_CHECKING` (a Protocol would repeat its API).
ALLOWED = {("aioloader.describe.dataset", "aioloader.runtime.loader"),
           ("aioloader.describe.dataset", "aioloader.runtime.access"),
           ("aioloader.describe.dataset", "aioloader.runtime.graph"),
           ("aioloader.describe.dataset", "aioloader.source")}


def _module(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    names = [f"{target}.{a.name}" for a in node.names]
    return [target, *names]


class _Imports(ast.NodeVisitor):
    """Every aioloader module a file imports, and where: "module", "TYPE_CHECKING" or
    "function" (inside a function body, at any depth)."""

    def __init__(self, mod: str, is_pkg: bool, files: set[str]) -> None:
        self.mod, self.is_pkg, self.files = mod, is_pkg, files
        self.where: list[str] = ["module"]
        self.found: dict[str, set[str]] = {}

    def _add(self, target: str) -> None:
        if target != self.mod:
            self.found.setdefault(target, set()).add(self.where[-1])

    def _inside(self, where: str, nodes: list[ast.stmt]) -> None:
        self.where.append(where)
        for n in nodes:
            self.visit(n)
        self.where.pop()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.dump(node.test):
            self.visit(node.test)
            self._inside("TYPE_CHECKING", node.body)
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        self._inside("function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        target, *names = _resolve(self.mod, self.is_pkg, node)
        modules = {n for n in names if n in self.files}  # `from pkg import module`
        own = self.mod.startswith(target + ".")  # its own package: already importing
        for m in modules if own else modules or ({target} & self.files):
            self._add(m)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name in self.files:
                self._add(a.name)


def _imports(root: Path = ROOT) -> dict[str, dict[str, set[str]]]:
    """Module -> {the aioloader module it imports: where it does}, for the package at `root`."""
    files = {_module(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        v = _Imports(mod, path.name == "__init__.py", set(files))
        v.visit(ast.parse(path.read_text()))
        graph[mod] = v.found
    return graph


IMPORTS = _imports()
GRAPH = {m: set(deps) for m, deps in IMPORTS.items()}
# What imports at load or type-check time: the graph but the one allowed lazy edge.
BELOW = {m: {d for d in deps if (m, d) not in ALLOWED} for m, deps in GRAPH.items()}


def rank(mod: str) -> int:
    name = mod
    while name not in RANK or (name == "aioloader" != mod):  # the package: its __init__ only
        assert "." in name, f"{mod} has no layer: give it a rank in LAYERS"
        name = name.rsplit(".", 1)[0]
    return RANK[name]


def test_every_module_has_a_layer():
    for mod in GRAPH:
        rank(mod)


def _upward(imports: dict[str, dict[str, set[str]]]) -> list[str]:
    upward = []
    for mod, deps in imports.items():
        for dep, where in deps.items():
            if rank(dep) <= rank(mod):
                continue
            if (mod, dep) in ALLOWED and "module" not in where:
                continue
            upward.append(f"{mod} ({LAYERS[rank(mod)][0]}) imports {dep} "
                          f"({LAYERS[rank(dep)][0]}) at {', '.join(sorted(where))} level")
    return sorted(upward)


def test_no_module_imports_a_higher_layer_at_any_level():
    upward = _upward(IMPORTS)
    assert not upward, "upward imports:\n  " + "\n  ".join(upward)


@pytest.mark.parametrize("where", ["function", "TYPE_CHECKING", "module"])
def test_the_check_sees_an_upward_import_at_every_level(tmp_path, where):
    """A copy of the package with one upward import added (the pure index layer reaching
    the runtime's stats) fails the check, wherever the import hides."""
    copy = tmp_path / "aioloader"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    target = copy / "index" / "permutation.py"
    line = "from ..runtime.stats import PipelineStats"
    added = {"function": f"\n\ndef _upward() -> object:\n    {line}\n    return PipelineStats\n",
             "TYPE_CHECKING": f"\nif TYPE_CHECKING:\n    {line}\n",
             "module": f"\n{line}\n"}[where]
    target.write_text(target.read_text() + added)
    assert _upward(_imports(copy)) == [
        f"aioloader.index.permutation (index) imports aioloader.runtime.stats (runtime) "
        f"at {where} level"]


def test_each_layer_is_a_folder():
    """Only the leaves and jax.py sit at the top of the package; every other module lives in
    its layer's folder."""
    loose = {p.stem for p in ROOT.glob("*.py")} - LOOSE
    assert not loose, f"modules outside a layer folder: {sorted(loose)}"
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert folders <= {name for _, names in LAYERS for name in names}, folders


def test_there_is_no_import_circle():
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(BELOW.get(m, ())):
            if state.get(n) == 1:
                cycle = [*path[path.index(n):], n] if n in path else [m, n]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(BELOW):
        if m not in state:
            visit(m, [m])


def test_the_upward_edge_is_lazy():
    for mod, dep in ALLOWED:
        assert "module" not in IMPORTS[mod].get(dep, set()), (mod, dep)


def _reach(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        for n in BELOW.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_format_layer_imports_nothing_above_it():
    for mod, deps in GRAPH.items():
        if mod.startswith("aioloader.arrayrecord"):
            assert all(d.startswith("aioloader.arrayrecord") for d in deps), (mod, deps)


def test_the_formats_import_only_the_arrayrecord_layer():
    for mod, deps in GRAPH.items():
        if mod.startswith("aioloader.formats"):
            assert all(d.startswith(("aioloader.arrayrecord", "aioloader.formats"))
                       for d in deps), (mod, deps)


def test_pure_algorithms_and_descriptions_import_no_runtime():
    """Describe, plan, schedule and execute stay apart: nothing below the runtime reaches it
    but through the Dataset's lazy start, and the pure modules reach no I/O, event loop or
    process code."""
    runtime = {m for m in GRAPH if rank(m) == rank("aioloader.runtime")}
    io = {m for m in GRAPH if rank("aioloader.io") <= rank(m) <= rank("aioloader.workers")}
    pure = [m for m in GRAPH if m.split(".")[1:2] in (["index"], ["elements"], ["describe"])]
    for mod in [*pure, "aioloader.options", "aioloader.errors"]:
        reach = _reach(mod)
        assert not reach & runtime, (mod, reach & runtime)
        assert not reach & io, (mod, reach & io)


def test_errors_is_a_leaf_and_only_jax_py_imports_jax():
    assert GRAPH["aioloader.errors"] <= {"aioloader.arrayrecord.errors",
                                          "aioloader.arrayrecord", "aioloader.urls"}
    for mod, path in ((m, ROOT.parent / (m.replace(".", "/") + ".py")) for m in GRAPH):
        if not path.exists() or mod == "aioloader.jax":
            continue
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | \
            {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(x == "jax" or x.startswith("jax.") for x in names), mod


def test_only_beam_py_imports_apache_beam():
    """The package imports without the `beam` extra: apache_beam stays inside aioloader.beam,
    and nothing imports aioloader.beam back but the CLI's `convert --beam`."""
    for mod in GRAPH:
        path = ROOT.parent / (mod.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT.parent / mod.replace(".", "/") / "__init__.py"
        if mod == "aioloader.beam" or mod.startswith("aioloader.beam."):
            continue
        if mod != "aioloader.tools.cli_convert":
            assert not {d for d in GRAPH[mod] if d.split(".")[:2] == ["aioloader", "beam"]}, mod
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
            {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(x.split(".")[0] == "apache_beam" for x in names), mod
