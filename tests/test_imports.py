"""No import cycle among the modules of rnntrain/ and data_tools/, and no import up the
layers (``LAYERS``).

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


# The layers, lowest first (README's architecture: config -> data -> ... -> run -> the
# commands). A module may import modules of its own layer and of the layers below, never
# one above. Every module must belong to a layer: a new package is placed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    # foundations: errors, atomic files, the tracer every stage's threads record into,
    # argument types; the package itself (its public names load lazily)
    ("rnntrain", "rnntrain.errors", "rnntrain.fsutil", "rnntrain.trace", "rnntrain.cli_args"),
    ("rnntrain.config",),
    ("rnntrain.frontend",),                        # features and line images
    ("rnntrain.data",),                            # metadata, plans, the chunk reader
    ("rnntrain.decode", "rnntrain.augment"),       # pure label/frame functions
    ("rnntrain.compute",),                         # model, tasks, worker pool, device
    ("rnntrain.parallel",),                        # the communicator and the exchange
    ("rnntrain.artifact",),                        # run folders, model paths, the zoo
    ("rnntrain.run",),                             # the training loop, checkpoints, metrics
    ("rnntrain.tools",),                           # run folders: runs, report, sweeps, folds
    ("rnntrain.infer",),                           # inference, export, ensembles
    ("rnntrain.api", "rnntrain.cli", "rnntrain.cli_decode", "rnntrain.cli_models",
     "rnntrain.cli_finetune", "rnntrain.cli_rank", "rnntrain.__main__"),  # commands
    ("data_tools",),                               # rnntrain-data, over the layers above
)


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix naming ``module`` or one of its packages."""
    best, found = -1, None
    for i, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, found = len(n), i
    assert found is not None, f"{module} is in no layer: place its package in LAYERS"
    return found


def test_no_module_imports_a_higher_layer():
    """No arrow runs up the layers (the data flow of the architecture): e.g. the reader
    and the worker pool record into the tracer at the bottom, not into the training loop's
    package; the metrics keys live with the trainer that writes them."""
    graph = import_graph()
    assert "rnntrain.trace" in graph and "rnntrain.run.train" in graph  # the real tree
    up = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
          for m, deps in sorted(graph.items()) for d in sorted(deps)
          if layer_of(d) > layer_of(m)]
    assert not up, "imports up the layers:\n" + "\n".join(up)


def test_layer_check_sees_a_lazy_upward_import(tmp_path):
    """The checker itself: an upward import inside a function is found."""
    pkg = tmp_path / "rnntrain"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data/__init__.py").write_text("")
    (pkg / "run").mkdir()
    (pkg / "run/__init__.py").write_text("")
    (pkg / "run/train.py").write_text("from rnntrain.data import reader\n")
    (pkg / "data/reader.py").write_text("def f():\n    from rnntrain.run import train\n")
    graph = import_graph(tmp_path, ("rnntrain",))
    up = [(m, d) for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m)]
    assert sorted(up) == [("rnntrain.data.reader", "rnntrain.run"),
                          ("rnntrain.data.reader", "rnntrain.run.train")]


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
