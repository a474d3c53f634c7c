"""The package's layers (runtime <- method <- evaluation <- the top level: the public API, cli.py),
each module importing only its own layer and those below, and no import cycle between modules:
every import counts, inside functions too (read with `ast`, nothing imported)."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "selectinfer"
LAYERS = {"runtime": 0, "method": 1, "evaluation": 2}
TOP = 3  # selectinfer/__init__.py and the modules of TOP_LEVEL
TOP_LEVEL = {"cli", "lm_eval_adapter"}  # lm_eval_adapter: a shim of evaluation.lm_eval_adapter
BASE = {"_native", "_testing", "_version"}  # compiled extensions and the version: every layer may use them


def modules(root: Path, package: str = "selectinfer") -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root (a package's __init__.py: the package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str], package: str = "selectinfer") -> set[str]:
    """The package's modules that module `name` imports anywhere in its file."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from P import M` imports the module P.M where M is one, else P itself
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known or a.name in BASE else module
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t == package or t.startswith(package + ".")}
    found.discard(name)
    return found


def layer(module: str, package: str = "selectinfer") -> int | None:
    """The module's layer; None for a module outside every layer."""
    parts = module.split(".")[1:]
    if not parts:
        return TOP
    if parts[0] in BASE and len(parts) == 1:
        return -1
    if parts[0] in LAYERS:
        return LAYERS[parts[0]]
    if parts[0] in TOP_LEVEL and len(parts) == 1:
        return TOP
    return None


def graph(root: Path, package: str = "selectinfer") -> dict[str, set[str]]:
    mods = modules(root, package)
    return {name: imports(name, path, set(mods), package) for name, path in mods.items()}


def layer_violations(g: dict[str, set[str]], package: str = "selectinfer") -> list[str]:
    problems = []
    for name in sorted(g):
        if layer(name, package) is None:
            problems.append(f"{name}: not in a layer (runtime/, method/, evaluation/ or the top level)")
            continue
        for target in sorted(g[name]):
            if layer(target, package) is None or layer(target, package) > layer(name, package):
                problems.append(f"{name} (layer {layer(name, package)}) imports {target} "
                                f"(layer {layer(target, package)})")
    return problems


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first one again at the end), or None: depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_is_parsed():
    g = graph(PACKAGE)
    assert {"selectinfer", "selectinfer.cli", "selectinfer.runtime.model", "selectinfer.method.prepare",
            "selectinfer.evaluation.evaluate"} <= set(g)
    # the edges are read: the public API's and prepare's (a lazy import inside a function included)
    assert "selectinfer.runtime.model" in g["selectinfer"]
    assert {"selectinfer.runtime.child_run", "selectinfer.method.convert"} <= g["selectinfer.method.prepare"]


def test_no_import_of_a_higher_layer():
    assert layer_violations(graph(PACKAGE)) == []


def test_no_import_cycle():
    assert find_cycle(graph(PACKAGE)) is None


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


def test_the_checks_find_what_they_look_for(tmp_path):
    """The checks on a package laid out as before (flat modules; evaluate and prepare importing each
    other, prepare lazily) and on one whose runtime imports a higher layer inside a function."""
    flat = tmp_path / "flat"
    _write(flat, {"__init__.py": "from .model import Model\n", "model.py": "from . import _native\n",
                  "evaluate.py": "from . import metrics\ndef f():\n    from .prepare import prepare\n",
                  "metrics.py": "", "prepare.py": "def g():\n    from .evaluate import run_in_child\n"})
    g = graph(flat)
    assert g["selectinfer.evaluate"] == {"selectinfer.metrics", "selectinfer.prepare"}
    assert find_cycle(g) in (["selectinfer.evaluate", "selectinfer.prepare", "selectinfer.evaluate"],
                             ["selectinfer.prepare", "selectinfer.evaluate", "selectinfer.prepare"])
    assert any("selectinfer.model: not in a layer" in p for p in layer_violations(g))

    layered = tmp_path / "layered"
    _write(layered, {"__init__.py": "", "runtime/__init__.py": "", "method/__init__.py": "",
                     "runtime/model.py": "from .. import _native\ndef f():\n    from ..method import convert\n",
                     "method/convert.py": "from ..runtime.model import f\nimport selectinfer.runtime.model\n",
                     "method/profiles.py": "from selectinfer import Model\n"})
    g = graph(layered)
    assert g["selectinfer.runtime.model"] == {"selectinfer._native", "selectinfer.method.convert"}
    assert layer_violations(g) == [
        "selectinfer.method.profiles (layer 1) imports selectinfer (layer 3)",
        "selectinfer.runtime.model (layer 0) imports selectinfer.method.convert (layer 1)"]
    assert find_cycle(g) == ["selectinfer.method.convert", "selectinfer.runtime.model", "selectinfer.method.convert"]
