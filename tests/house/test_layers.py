"""The house's layers: no import cycles among specdec's modules nor among its packages, and
each layer imports only from the layers below it (docs/architecture.md, "Modules").  Imports
are read with `ast`, function-level (lazy) ones and those under `if TYPE_CHECKING:` included:
not even an annotation may point up."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# layer of a module (dotted name below specdec) -> rank; a module may import ranks <= its own
LAYERS = [("kernels", 0), ("errors", 1),
          ("generation.interfaces", 1),   # the Session protocol the engine implements
          ("engine", 2), ("text", 2), ("models", 2), ("generation", 3), ("speculation", 4),
          ("api", 5), ("frontends", 6),
          ("testing", 7)]             # the public test toolkit: above everything it checks


def module_files() -> dict[str, Path]:
    """'engine.transformer' -> its file, for specdec/ and kernels/ (as 'kernels.x')."""
    out = {}
    for base, prefix in ((ROOT / "specdec", ""), (ROOT / "kernels", "kernels.")):
        for f in base.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = prefix + ".".join(parts) if parts else prefix.rstrip(".")
            out[name or "__init__"] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The specdec modules `name` imports, at run time or for annotations."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "__init__":
        pkg = []
    found: set[str] = set()

    def visit(node):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1] if node.level > 1 else pkg
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("specdec."):
                mod = node.module[len("specdec."):]
            else:
                mod = None
            if mod is not None:
                targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name[len("specdec."):] for a in node.names if a.name.startswith("specdec.")]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    # a package's __init__ re-exports what is below it: edges into it are edges into them
    return {n: {d for d in imports(n, f, known) if not (n.startswith(d + ".") or n == "__init__")}
            for n, f in files.items()}


def rank(name: str) -> int:
    return next(r for prefix, r in LAYERS if name == prefix or name.startswith(prefix + "."))


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
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

    for v in g:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def package(name: str) -> str:
    """'speculation.drafters.draft_model' -> 'speculation'; a module at the top is its own."""
    return name.split(".")[0]


def test_no_cycles_between_packages():
    g: dict[str, set[str]] = {}
    for a, deps in graph().items():
        if a != "__init__":
            g.setdefault(package(a), set()).update(package(b) for b in deps
                                                   if b != "__init__" and package(b) != package(a))
    assert cycles(g) == []


def test_each_layer_imports_only_from_below():
    g = graph()
    wrong = [(a, b) for a, deps in g.items() if a != "__init__" for b in deps
             if b != "__init__" and rank(b) > rank(a)]
    assert wrong == []


def test_kernels_import_nothing_from_specdec():
    g = graph()
    assert all(d.startswith("kernels") for n, deps in g.items() if n.startswith("kernels")
               for d in deps)
