"""No import cycle among the modules of rnntrain/ and data_tools/.

The graph is built from the source (``ast``), not from what happens to be imported at
test time: every ``import`` statement counts, including those inside functions (a lazy
import hides a cycle from the interpreter, not from the design), except those under
``if TYPE_CHECKING:``. Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rnntrain", "data_tools")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} of every module of ``packages`` under ``root``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _under_type_checking(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that module ``name`` (file ``path``) imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str):
        # the module itself and the packages above it (importing a.b.c runs a and a.b)
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            if mod in modules and mod != name and not name.startswith(mod + "."):
                found.add(mod)  # (this module's own packages ran before it: no edge)

    for node in ast.walk(tree):
        if _under_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            add(src)
            for a in node.names:  # ``from pkg import module`` imports the submodule
                if f"{src}.{a.name}" in modules:
                    add(f"{src}.{a.name}")
    return found


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {m: imports_of(m, f, modules) for m, f in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "rnntrain.data.plan" in graph  # the real tree was read
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_data_stage_does_not_import_compute_or_torch_stages():
    """Planning and reading work from metadata alone: data never imports compute, parallel
    or run (the direction of the data flow). The one exception is the tracer, an
    instrument every stage's threads record into (it imports nothing of the stages)."""
    graph = import_graph()
    assert graph["rnntrain.run.trace"] <= {"rnntrain.errors", "rnntrain.fsutil"}
    for mod, deps in graph.items():
        if mod.startswith("rnntrain.data"):
            bad = {d for d in deps - {"rnntrain.run", "rnntrain.run.trace"}
                   if d.startswith(("rnntrain.compute", "rnntrain.parallel", "rnntrain.run",
                                    "rnntrain.tools"))}
            assert not bad, f"{mod} imports {sorted(bad)}"


def test_detects_a_cycle_hidden_in_a_function(tmp_path):
    """The checker itself: a lazy (function-level) import closing a circle, a relative
    ``from . import`` and a package ``__init__`` are all seen."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from . import c\n",
        "pkg/sub/c.py": """
            def late():
                import pkg.a  # hidden from a top-level reading
            """,
        "pkg/d.py": "from .sub.c import late\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(textwrap.dedent(text))
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.d"] == {"pkg.sub", "pkg.sub.c"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    (tmp_path / "pkg/sub/c.py").write_text("def late():\n    return 1\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == []
