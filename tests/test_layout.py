"""The code's layout, checked on the source: no import cycles in prism, no private names imported, no import up the layers.

Layers, bottom to top (a module imports its own layer and the ones below)::

    common < ingest < analysis < whatif < offline, serve < cli

``offline`` and ``serve`` are side by side (neither imports the other);
``deploy`` imports nothing of prism but itself; only ``prism.cli`` imports
the ``collectors`` and ``synthetic`` packages. ``collectors`` sit beside
``serve`` (common, ingest, serve); ``synthetic`` may use up to ``whatif``
(:mod:`synthetic.fromtrace` simulates op traces).

The import graph comes from the ``ast`` of every file: every ``import`` and
``from ... import``, those inside functions too; ``from package import
name`` goes to the module the package's ``__init__`` takes ``name`` from.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("prism", "collectors", "synthetic")

#: what each layer may import (its own layer included); ``prism`` itself (the root package: the version) is open to all
LAYERS = {
    "common": {"common"},
    "ingest": {"common", "ingest"},
    "analysis": {"common", "ingest", "analysis"},
    "whatif": {"common", "ingest", "analysis", "whatif"},
    "offline": {"common", "ingest", "analysis", "whatif", "offline"},
    "serve": {"common", "ingest", "analysis", "whatif", "serve"},
    "deploy": {"deploy"},
    "cli": {"common", "ingest", "analysis", "whatif", "offline", "serve", "deploy", "cli", "collectors", "synthetic"},
    "collectors": {"common", "ingest", "serve", "collectors"},
    "synthetic": {"common", "ingest", "analysis", "whatif", "synthetic"},
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    module: str  # the module imported (a name taken from a package's __init__: the module it comes from)
    name: str | None  # the name taken from it (``from module import name``), None for ``import module``
    line: int
    alias: str | None = None  # ``as alias``
    typing_only: bool = False  # under ``if TYPE_CHECKING:`` (for annotations; never run)

    def key(self) -> tuple[str, str, str | None]:
        return self.importer, self.module, self.name


def module_name(path: Path, root: Path = ROOT) -> str:
    """``prism/analysis/jobs.py`` -> ``prism.analysis.jobs``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path = ROOT, tops: tuple[str, ...] = FIRST_PARTY) -> dict[str, Path]:
    """Dotted module name -> file, for the packages ``tops`` under ``root``."""
    out = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            out[module_name(path, root)] = path
    return out


def _typing_only_lines(tree: ast.Module) -> set[int]:
    """Lines of the imports under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def raw_imports(name: str, source: str, is_package: bool) -> list[Import]:
    """Every import in a module's source (anywhere: functions too), relative ones resolved; a name is not yet resolved."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    typing_only = _typing_only_lines(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(name, alias.name, None, node.lineno, alias.asname, node.lineno in typing_only) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "__future__":
                continue
            out += [Import(name, module, alias.name, node.lineno, alias.asname, node.lineno in typing_only) for alias in node.names]
    return out


class ImportGraph:
    """The imports of a set of modules (``{name: source}``), names taken from packages resolved to their modules."""

    def __init__(self, sources: dict[str, str], packages: set[str]):
        self.modules = set(sources)
        self.packages = packages
        self.raw = {m: raw_imports(m, s, m in packages) for m, s in sources.items()}
        self.imports = [self._resolve(i) for imps in self.raw.values() for i in imps]

    def _resolve(self, imp: Import) -> Import:
        """``from package import x``: a submodule x, or the module the package's ``__init__`` took x from."""
        module, name, seen = imp.module, imp.name, set()
        while name is not None and module in self.packages and (module, name) not in seen:
            seen.add((module, name))
            if f"{module}.{name}" in self.modules:
                return Import(imp.importer, f"{module}.{name}", None, imp.line, typing_only=imp.typing_only)
            source = next((i for i in self.raw.get(module, []) if (i.alias or i.name) == name), None)
            if source is None:  # defined in the __init__ itself
                break
            module, name = source.module, source.name  # (None: the package's __init__ imports a module as the name)
        return Import(imp.importer, module, name, imp.line, typing_only=imp.typing_only)

    def first_party(self, tops: tuple[str, ...] = FIRST_PARTY) -> list[Import]:
        return [i for i in self.imports if i.module.split(".")[0] in tops]

    def digraph(self, top: str = "prism") -> nx.DiGraph:
        """Modules of ``top`` and who imports whom among them when run (an import for annotations only is no edge:
        a module may name in its annotations a type of a module that imports it)."""
        g = nx.DiGraph()
        g.add_nodes_from(m for m in self.modules if m.split(".")[0] == top)
        for i in self.imports:
            if i.importer in g and i.module in g and i.importer != i.module and not i.typing_only:
                g.add_edge(i.importer, i.module)
        return g


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """Groups of modules that import each other (directly or round a loop), each sorted."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def private_imports(imports: list[Import]) -> list[Import]:
    """Imports of a leading-underscore name (not a dunder) or module from another first-party module."""
    def private(text: str | None) -> bool:
        return bool(text) and text.startswith("_") and not (text.startswith("__") and text.endswith("__"))

    return [i for i in imports if i.importer != i.module and (private(i.name) or any(private(p) for p in i.module.split(".")))]


def layer(module: str) -> str | None:
    """The layer of a first-party module (a package of prism's that is none of LAYERS: its own name, which may
    import nothing); None for the root package ``prism`` (the version: open to all) and for the benchmarks."""
    parts = module.split(".")
    if parts[0] in ("collectors", "synthetic"):
        return parts[0]
    if parts[0] != "prism" or len(parts) == 1:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def upward_imports(imports: list[Import]) -> list[Import]:
    """Imports of a module of a layer its importer may not use (see :data:`LAYERS`)."""
    out = []
    for i in imports:
        mine, theirs = layer(i.importer), layer(i.module)
        if theirs is None:
            continue
        if (mine is None and i.importer == "prism") or (mine is not None and theirs not in LAYERS.get(mine, ())):
            out.append(i)  # (the root package imports nothing)
    return out


def project_graph(root: Path = ROOT) -> ImportGraph:
    files = source_files(root)
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    for path in sorted((root / "benchmarks").glob("*.py")):  # importers only (scripts, no package)
        files[f"benchmarks.{path.stem}"] = path
    return ImportGraph({m: p.read_text(encoding="utf-8") for m, p in files.items()}, packages)


def _explain(found: list[Import]) -> str:
    return "\n".join(f"  {i.importer}:{i.line} imports {i.module}" + (f".{i.name}" if i.name else "") for i in found)


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return project_graph()


# ---- the project

def test_prism_has_no_import_cycles(graph):
    g = graph.digraph("prism")
    assert g.number_of_nodes() > 50 and g.number_of_edges() > 100  # the graph was found at all
    assert cycles(g) == [], "modules of prism that import each other:\n" + "\n".join(" -> ".join(c) for c in cycles(g))


def test_no_private_names_imported_from_another_module(graph):
    found = private_imports(graph.first_party())
    assert not found, "private names imported from another module (make them public, or move the code):\n" + _explain(found)


def test_no_imports_up_the_layers(graph):
    found = upward_imports(graph.first_party())
    assert not found, "imports up the layers (" + " < ".join(LAYERS) + "):\n" + _explain(found)


# ---- the checker itself, on small made-up packages

def _toy(sources: dict[str, str]) -> ImportGraph:
    packages = {m.removesuffix(".__init__") for m in sources if m.endswith(".__init__")}
    return ImportGraph({m.removesuffix(".__init__"): s for m, s in sources.items()}, packages)


def test_checker_finds_a_cycle_through_a_function_level_import():
    g = _toy({
        "prism.__init__": "",
        "prism.common.__init__": "",
        "prism.common.a": "from prism.common.b import f\n",
        "prism.common.b": "def f():\n    from prism.common import c\n",
        "prism.common.c": "import prism.common.a\n",
        "prism.common.d": "from prism.common.a import f\n",
    })
    assert cycles(g.digraph()) == [["prism.common.a", "prism.common.b", "prism.common.c"]]


def test_checker_follows_a_name_through_a_package_init():
    """``from pkg import X`` is an import of the module X comes from: here a cycle, where the package alone would hide it."""
    g = _toy({
        "prism.__init__": "",
        "prism.analysis.__init__": "",
        "prism.analysis.diagnosis.__init__": "from prism.analysis.diagnosis.lag import Lag\n",
        "prism.analysis.diagnosis.lag": "from prism.analysis.steps import Steps\nclass Lag: ...\n",
        "prism.analysis.steps": "from prism.analysis.diagnosis import Lag\nclass Steps: ...\n",
    })
    assert ("prism.analysis.steps", "prism.analysis.diagnosis.lag", "Lag") in {i.key() for i in g.imports}
    assert cycles(g.digraph()) == [["prism.analysis.diagnosis.lag", "prism.analysis.steps"]]


def test_checker_leaves_out_imports_for_annotations_only_from_cycles():
    g = _toy({
        "prism.__init__": "",
        "prism.offline.__init__": "",
        "prism.offline.replay": "from prism.offline.trace import chrome_trace\nclass Result: ...\n",
        "prism.offline.trace": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prism.offline.replay import Result\n",
    })
    assert cycles(g.digraph()) == []
    assert [i.key() for i in g.imports if i.typing_only] == [("prism.offline.trace", "prism.offline.replay", "Result")]


def test_checker_finds_private_imports():
    g = _toy({
        "prism.__init__": "",
        "prism.serve.__init__": "",
        "prism.serve.w": "def f():\n    from prism.analysis.jobs import _mark, mark, __version__\n",
        "prism.serve.v": "from . import _helpers\nfrom .w import f as _f\n",
        "prism.serve._helpers": "",
        "prism.analysis.__init__": "",
        "prism.analysis.jobs": "def _mark(): ...\ndef mark(): ...\n",
    })
    assert {i.key() for i in private_imports(g.first_party())} == {
        ("prism.serve.w", "prism.analysis.jobs", "_mark"),
        ("prism.serve.v", "prism.serve._helpers", None),  # a private module
    }


def test_checker_finds_imports_up_the_layers():
    g = _toy({
        "prism.__init__": "",
        "prism.ingest.__init__": "",
        "prism.ingest.r": "from prism.analysis import jobs\nfrom prism.common.logs import x\n",
        "prism.analysis.__init__": "",
        "prism.analysis.jobs": "import prism.serve.daemon\n",
        "prism.offline.__init__": "",
        "prism.offline.replay": "from prism.serve.window import W\n",
        "prism.serve.__init__": "",
        "prism.serve.warmup": "from synthetic import preset\n",
        "prism.deploy.__init__": "",
        "prism.deploy.g": "from prism.common.logs import x\n",
        "prism.cli.__init__": "",
        "prism.cli.synth": "from synthetic import preset\nfrom prism.offline.replay import replay\n",
        "collectors.__init__": "",
        "collectors.collect": "from prism.serve.produce import P\nfrom prism.analysis.jobs import J\n",
        "synthetic.__init__": "",
        "synthetic.fromtrace": "from prism.whatif.graph import simulate\n",
    })
    assert {(i.importer, i.module) for i in upward_imports(g.first_party())} == {
        ("prism.ingest.r", "prism.analysis.jobs"),
        ("prism.analysis.jobs", "prism.serve.daemon"),
        ("prism.offline.replay", "prism.serve.window"),  # offline and serve are side by side
        ("prism.serve.warmup", "synthetic"),
        ("prism.deploy.g", "prism.common.logs"),  # deploy imports nothing of prism but itself
        ("collectors.collect", "prism.analysis.jobs"),
    }


def _design_paths(text: str) -> set[str]:
    """The paths under prism/, collectors/ or synthetic/ that docs/design.md's tables name in backquotes (``{a,b}`` expanded).

    Only table rows: the prose may name a module that does not exist yet (how to add a format, say).
    """
    import re

    out = set()
    rows = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    for path in re.findall(r"`((?:prism|collectors|synthetic)/[\w/{},.]*)`", rows):
        m = re.search(r"\{([\w,]+)\}", path)
        names = m.group(1).split(",") if m else [""]
        out |= {path[:m.start()] + n + path[m.end():] if m else path for n in names}
    return out


def module_map_gaps(root: Path) -> tuple[list[str], list[str]]:
    """Modules of prism/ that docs/design.md does not name (itself or its package), and paths it names that do not exist."""
    named = _design_paths((root / "docs" / "design.md").read_text())
    modules = [p.relative_to(root).as_posix() for p in sorted((root / "prism").rglob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    unnamed = [m for m in modules if m not in named and m.rsplit("/", 1)[0] + "/" not in named]
    missing = sorted(p for p in named if not (root / p).exists())
    return unnamed, missing


def test_the_design_doc_maps_every_module_and_only_real_ones():
    unnamed, missing = module_map_gaps(ROOT)
    assert not unnamed, f"modules docs/design.md does not name (add them to its module map): {unnamed}"
    assert not missing, f"paths docs/design.md names that do not exist: {missing}"


def test_module_map_check_finds_an_unnamed_module_and_a_stale_path(tmp_path):
    (tmp_path / "prism" / "ingest").mkdir(parents=True)
    for name in ("records.py", "readers.py", "new_format.py"):
        (tmp_path / "prism" / "ingest" / name).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("| `prism/ingest/{records,readers}.py` | ... |\n| `prism/ingest/gone.py` | ... |\n")
    assert module_map_gaps(tmp_path) == (["prism/ingest/new_format.py"], ["prism/ingest/gone.py"])
