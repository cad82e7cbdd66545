"""The house rules of DESIGN.md, checked on the source: no import circle, and lower layers
never import higher ones (module-level imports; `TYPE_CHECKING` blocks aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import aioloader

ROOT = Path(aioloader.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
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


def _imports() -> dict[str, set[str]]:
    """Module -> the aioloader modules it imports at module level."""
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        out: set[str] = set()
        for node in tree.body:  # module level only: lazy imports inside functions are not
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    break
                if isinstance(sub, ast.ImportFrom):
                    target, *names = _resolve(mod, path.name == "__init__.py", sub)
                    modules = {n for n in names if n in files}  # `from pkg import module`
                    if mod.startswith(target + "."):  # its own package: already importing
                        out |= modules
                    else:
                        out |= modules or ({target} & set(files))
                elif isinstance(sub, ast.Import):
                    out |= {a.name for a in sub.names if a.name in files}
        out.discard(mod)
        graph[mod] = out
    return graph


GRAPH = _imports()


def test_there_is_no_import_circle():
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in GRAPH.get(m, ()):
            if state.get(n) == 1:
                cycle = [*path[path.index(n):], n] if n in path else [m, n]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in GRAPH:
        if m not in state:
            visit(m, [m])


def _reach(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        for n in GRAPH.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_format_layer_imports_nothing_above_it():
    for mod, deps in GRAPH.items():
        if mod.startswith("aioloader.arrayrecord"):
            assert all(d.startswith("aioloader.arrayrecord") for d in deps), (mod, deps)


def test_pure_algorithms_and_descriptions_import_no_runtime():
    """Describe, plan, schedule and execute stay apart: nothing below the runtime reaches it,
    and the pure modules reach no I/O, event loop or process code."""
    runtime = {m for m in GRAPH if m.startswith("aioloader.runtime")}
    io = {"aioloader.storage", "aioloader.backends", "aioloader.gcs_aiohttp", "aioloader.gcs_curl",
          "aioloader.gcs_client",
          "aioloader.sync", "aioloader.workers.pool",
          "aioloader.source", "aioloader.lifecycle"}
    for mod in ("aioloader.permutation", "aioloader.sampling", "aioloader.planning",
                "aioloader.autotune",
                "aioloader.packing", "aioloader.transforms", "aioloader.state",
                "aioloader.options", "aioloader.errors", "aioloader.dataset",
                "aioloader.description", "aioloader.plan"):
        reach = _reach(mod)
        assert not reach & runtime, (mod, reach & runtime)
        assert not reach & io, (mod, reach & io)
    for mod in GRAPH:
        if not mod.startswith("aioloader.runtime") and mod != "aioloader":
            assert not GRAPH[mod] & runtime, (mod, GRAPH[mod] & runtime)


def test_errors_is_a_leaf_and_only_jax_py_imports_jax():
    assert GRAPH["aioloader.errors"] <= {"aioloader.arrayrecord.errors",
                                          "aioloader.arrayrecord"}
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
    and nothing imports aioloader.beam back."""
    for mod in GRAPH:
        path = ROOT.parent / (mod.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT.parent / mod.replace(".", "/") / "__init__.py"
        if mod == "aioloader.beam" or mod.startswith("aioloader.beam."):
            continue
        assert not {d for d in GRAPH[mod] if d.split(".")[:2] == ["aioloader", "beam"]}, mod
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
            {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(x.split(".")[0] == "apache_beam" for x in names), mod
