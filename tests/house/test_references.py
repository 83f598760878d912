"""Every reference the prose makes exists: repository paths (``specdec/engine/transformer.py``,
``benchmarks/results/amd/``), markdown links, full dotted names (``specdec.api.Model``) and
``module.name`` pairs whose module is one of ours (``legacy_ir.dot32_lanes``), in README.md,
CONTRIBUTING.md, docs/*.md, tests/README.md and the docstrings of specdec/, kernels/,
benchmarks/, tests/ and docs/, and their comments.

Dotted names resolve by import and attribute lookup; a ``module.name`` pair needs ``name``
defined in that module (an import there does not count, except in a package's __init__, which
re-exports), or ``name`` an attribute of one of our classes (prose about an object,
``model.generate``; not checked in code examples).  A short name that is both ours and a
library's (``ray``, Ray Serve's ``serve``) is left alone, as are GGUF metadata keys
(``tokenizer.ggml.pre``), placeholders (``benchmarks/NAME.py``) and another project's paths
(``llama.cpp's tests/...``).  ``x.name`` with ``x`` none of our modules but ``name`` a
function or class of ours is a module that moved or went.  Paths resolve from the repository root (a markdown file's own
folder too), with any suffix (``verify_curve.{json,png}``); ``kernels/reference.attention``
is a path and a name in it; a shorter path to a .py or .md file (``serve/launch.py``) must
be the end of one of ours, and a file name alone in backticks the name of one.

A claim in backticks (```Weights.from_gguf```, ```chat.chat_prompt(...)```) or in a diagram (a
fence with no language) is checked further: ``Class.name`` with ``Class`` one of ours needs
``name`` defined by that class or a class of ours it derives from, and ``x.name`` with ``x`` a
lowercase word that is none of our modules, while ``name`` is ours, needs ``x`` to be one of
the object words prose uses (OBJECTS: ``session.eval``, ``stats.by_drafter``): otherwise it
names a module that does not exist."""
from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "tests" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
CODE = [p for d in ("specdec", "kernels", "benchmarks", "tests", "docs") for p in sorted((ROOT / d).rglob("*.py"))]
TOP = ("specdec", "kernels", "tests", "benchmarks", "docs", "examples", ".ci")
PATH = re.compile(r"(?<![\w./~$-])((?:%s)/[\w./*-]*[\w*/])" % "|".join(re.escape(t) for t in TOP))
# a shorter path to a file of ours (``serve/launch.py``): some file of the repository ends with it
PARTIAL = re.compile(r"(?<![\w./~$-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md))\b")
BARE = re.compile(r"`([\w-]+\.(?:py|md))`")                      # `draft_caps.py`: a file of ours of that name
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-]|\.\w)")
GGUF_KEY = re.compile(r"^(tokenizer\.(ggml|chat_template)|general)\b")
# code examples (their variables are not modules): python and console blocks, doctest lines
FENCE = re.compile(r"^(`{3,})(python|console|pycon)\n.*?^\1$|^>>> .*?$", re.S | re.M)
PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]+(/|\.|$)")
FILE_SUFFIX = re.compile(r"\.(py|md|json|jsonl|gguf|png|sh|txt|toml|js|html|css|log|csv|yaml|yml|gz|so|cfg|lock)$")
# libraries whose module names are also ours (serve/ray.py) or that the prose names by alias
LIBRARIES = {"ray", "serve", "models", "np", "numpy", "numba", "gguf", "tokenizers", "sentencepiece", "jinja2",
             "fastapi", "uvicorn", "pydantic", "openai", "httpx", "selenium", "pytest", "hypothesis", "matplotlib",
             "plt", "os", "sys",
             "json", "time", "re", "math", "ast", "typing", "threading", "asyncio", "subprocess", "signal",
             "argparse", "collections", "dataclasses", "functools", "itertools", "pathlib", "random", "select",
             "socket", "struct", "platform", "string", "types", "enum", "io", "abc", "queue", "codecs", "http"}
# the words prose uses for an object of ours or of a client library (``session.eval``): never modules
OBJECTS = {"self", "session", "stats", "store", "sink", "drafter", "policy", "client", "message", "function",
           "response_format", "module", "target", "draft", "conv", "spec", "cache", "cfg", "rng", "plan"}
WIRE = {"chat.completion", "chat.completion.chunk"}                # OpenAI's object types, not names
CLAIM = re.compile(r"(?<!`)``?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`\n]*\))?``?(?!`)")
DIAGRAM = re.compile(r"^(`{3,})\n.*?^\1$", re.S | re.M)


@lru_cache(maxsize=None)
def tree(p: Path) -> ast.Module:
    return ast.parse(p.read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def texts() -> list[tuple[Path, int, str]]:
    """(file, line, text) of every markdown file, every docstring and every comment."""
    out = [(p, 1, p.read_text(encoding="utf-8")) for p in DOCS]
    for p in CODE:
        for node in ast.walk(tree(p)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and node.body:
                    out.append((p, node.body[0].lineno, doc))
        for tok in tokenize.generate_tokens(io.StringIO(p.read_text(encoding="utf-8")).readline):
            if tok.type == tokenize.COMMENT:
                out.append((p, tok.start[0], tok.string))
    return out


@lru_cache(maxsize=None)
def modules() -> dict[str, list[str]]:
    """short name -> our dotted module names ('model' -> specdec.engine.transformer, specdec.api.model, ...)."""
    out: dict[str, list[str]] = {}
    for base, pkg in ((ROOT / "specdec", "specdec"), (ROOT / "kernels", "specdec.kernels")):
        for f in base.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            out.setdefault(name.rpartition(".")[2], []).append(name)
    out["kernels"] = ["specdec.kernels"]
    for _, _, text in texts():                      # `from specdec.testing import strategies as sds`
        for name, alias in re.findall(r"\bimport ([\w.]+) as (\w+)", text):
            if name.rpartition(".")[2] in out and alias not in out:
                out[alias] = out[name.rpartition(".")[2]]
    return out


@lru_cache(maxsize=None)
def top_level() -> dict[str, str]:
    """function or class name -> the module of ours that defines it (at top level)."""
    out = {}
    for module in sorted({m for ms in modules().values() for m in ms}):
        for node in tree(Path(importlib.import_module(module).__file__)).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                out.setdefault(node.name, module)
    return out


@lru_cache(maxsize=None)
def defined(module: str) -> frozenset[str]:
    """Top-level names a module defines (a package's __init__: also those it imports)."""
    mod = importlib.import_module(module)
    path = Path(mod.__file__)
    names = set()
    for node in ast.walk(tree(path)) if path.name == "__init__.py" else tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and path.name == "__init__.py":
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if hasattr(mod, "__path__"):
        names |= {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    return frozenset(names)


@lru_cache(maxsize=None)
def attributes() -> frozenset[str]:
    """Every name one of our classes defines (methods, fields, class constants) or sets on self."""
    names = set()
    for p in CODE:
        for node in ast.walk(tree(p)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return frozenset(names)


@lru_cache(maxsize=None)
def classes() -> dict[str, list[ast.ClassDef]]:
    out: dict[str, list[ast.ClassDef]] = {}
    for p in CODE:
        for node in ast.walk(tree(p)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


@lru_cache(maxsize=None)
def class_names(cls: str) -> frozenset[str]:
    """What a class of ours (every class of that name) defines, sets on self or inherits from a
    class of ours; "*" when it derives from another library's class (anything may come from it)."""
    names = set()
    for node in classes()[cls]:
        for b in node.bases:
            base = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
            if base in classes() and base != cls:
                names |= class_names(base)
            elif base not in (None, "object", "Protocol", "Generic"):
                names.add("*")
        for item in ast.walk(node):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item is not node:
                names.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names.add(item.target.id)
            elif isinstance(item, ast.Assign):
                names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                names.add(item.attr)
    return frozenset(names)


def claim_problem(ref: str) -> str | None:
    """A backticked or drawn ``x.name``: a class's member that is not there, or a module that is not."""
    head, _, rest = ref.partition(".")
    name = rest.split(".")[0]
    if (ref in WIRE or FILE_SUFFIX.search(ref) or head in LIBRARIES or GGUF_KEY.match(ref) or head == "specdec"
            or head in modules()):
        return None
    if head in classes() and head[0].isupper():
        members = class_names(head)
        return None if name in members or "*" in members else f"no {ref} ({head} has no {name})"
    if head.islower() and len(head) > 1 and head not in OBJECTS and (name in top_level() or name in attributes()):
        return f"no {ref} ({head} is none of our modules)"
    return None


@lru_cache(maxsize=None)
def repository_files() -> frozenset[str]:
    return frozenset(p.relative_to(ROOT).as_posix() for d in TOP if (ROOT / d).is_dir()
                     for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md"))


def path_exists(ref: str, folders: list[Path]) -> bool:
    """A file or folder (any suffix; * globs), or kernels/reference.attention: a name in a module."""
    for base in folders:
        if list(base.glob(ref)) if "*" in ref else (base / ref).exists() or list(base.glob(ref + ".*")):
            return True
    stem, _, name = ref.rpartition(".")
    parts = Path(stem).parts
    if (ROOT / (stem + ".py")).is_file() and parts[0] in ("specdec", "kernels"):
        return name in defined(".".join(("specdec", *parts) if parts[0] == "kernels" else parts))
    return False


def resolves(dotted: str) -> bool:
    """specdec.api.Model.generate: the longest importable prefix, then attribute lookup."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for a in parts[i:]:
            if hasattr(obj, a):
                obj = getattr(obj, a)
            elif a in (getattr(obj, "__dataclass_fields__", None) or {}) or a in getattr(obj, "__annotations__", {}):
                obj = None                          # a field without a class-level default
            else:
                return False
        return True
    return False


def short_resolves(mod_short: str, name: str) -> bool:
    """module.name for a module of ours: defined there, or (an object's) an attribute of our classes
    (not after a package's name, where only its modules and exports count; a one-letter name
    there is a placeholder)."""
    packages = all(hasattr(importlib.import_module(m), "__path__") for m in modules()[mod_short])
    if name in attributes() and not name[0].isupper() and (not packages or len(name) == 1):
        return True
    return any(name in defined(module) for module in modules()[mod_short])


def problems(path: Path, line: int, text: str) -> list[str]:
    def where(m: re.Match) -> str:
        return f"{path.relative_to(ROOT)}:{line + text.count(chr(10), 0, m.start())}"

    out = []
    folders = [ROOT] if path.suffix == ".py" else [ROOT, path.parent]
    for m in PATH.finditer(text):
        ref = m.group(1).rstrip(".")
        if PLACEHOLDER.search(ref) or text[max(0, m.start() - 3):m.start()] == "'s ":
            continue
        if not path_exists(ref, folders):
            out.append(f"{where(m)}: no {ref}")
    for m in PARTIAL.finditer(text):
        ref = m.group(1)
        if ref.split("/")[0] in TOP or text[max(0, m.start() - 3):m.start()] == "'s ":
            continue
        if not any(f.endswith("/" + ref) for f in repository_files()):
            out.append(f"{where(m)}: no {ref} (no file of ours ends so)")
    for m in BARE.finditer(text):
        if not any(f.rpartition("/")[2] == m.group(1) for f in repository_files()):
            out.append(f"{where(m)}: no {m.group(1)} (no file of ours has that name)")
    if path.suffix == ".md":
        for m in LINK.finditer(text):
            ref = m.group(1)
            if "://" not in ref and not ref.startswith("mailto:") and not (path.parent / ref).exists():
                out.append(f"{where(m)}: link to no {ref}")
    examples = [range(m.start(), m.end()) for m in FENCE.finditer(text)]
    for m in DOTTED.finditer(text):
        ref = m.group(1)
        head, _, rest = ref.partition(".")
        if FILE_SUFFIX.search(ref) or head in LIBRARIES or GGUF_KEY.match(ref):
            continue
        name = rest.split(".")[0]
        if head == "specdec":
            ok = resolves(ref)
        elif head in modules():
            ok = any(m.start() in r for r in examples) or short_resolves(head, name)
        elif name in top_level() and name not in attributes():   # a module that moved or went
            ok, ref = False, f"{ref} ({name} is in {top_level()[name]})"
        else:
            continue
        if not ok:
            out.append(f"{where(m)}: no {ref}")
    claims = [m for m in CLAIM.finditer(text) if not any(m.start() in r for r in examples)]
    if path.suffix == ".md":
        claims += [m for d in DIAGRAM.finditer(text) for m in DOTTED.finditer(text, d.start(), d.end())]
    for m in claims:
        problem = claim_problem(m.group(1))
        if problem and problem not in {p.split(": ", 1)[1] for p in out}:
            out.append(f"{where(m)}: {problem}")
    return out


def test_references_exist():
    found = [p for path, line, text in texts() for p in problems(path, line, text)]
    assert not found, "\n".join(found)


def test_the_check_sees_what_goes_stale():
    md = ROOT / "docs" / "x.md"
    bad = ["specdec/resources.py", "`specdec.policies`", "legacy.dot32_lanes", "model.Weights", "[a](img/none.png)",
           "generate.kept_prefix", "kernels/reference.nothing", "benchmarks/results/nothing.json"]
    good = ["specdec/engine/resources.py", "`specdec.speculation.policies`", "legacy_ir.dot32_lanes",
            "weights.Weights", "model.generate", "specdec.api.Model.generate", "benchmarks/NAME.py",
            "llama.cpp's tests/test-tokenizer-0", "tokenizer.ggml.pre", "serve.deployment", "np.float32",
            "kernels/reference.attention", "benchmarks/results/intel/verify_curve.{json,png}", "tests/README.md"]
    bad += ["`chat.chat_prompt`", "`Model.no_such_method`", "```\nprompt ──chat.chat_prompt──▶ text\n```",
            "`Weights.load`", "``sampling.nothing_here()``", "`specdec.no_such_function`", "speculation.plan",
            "`serve/cli.py`", "`plan.py`"]
    good += ["`Model.chat_prompt`", "`Weights.from_gguf`", "`session.eval`", "`chat.completion.chunk`",
             "`ModelConfig.from_gguf`", "`SpecStats.n_steps`", "serve/launch.py", "llama.cpp's src/x.py",
             "```\nModelSession.eval(ids)\n```", "`draft_caps.py`"]
    assert [b for b in bad if not problems(md, 1, b)] == []
    assert [p for g in good for p in problems(md, 1, g)] == []
