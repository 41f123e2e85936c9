"""The package's structure, checked from its source (ast, nothing imported): no import cycle between
rnnconvert modules and no ``_underscore`` name imported from another module (docs/architecture.md).

Every import counts, also those inside functions: a lazy import still ties the two modules together."""

from __future__ import annotations

import ast
import functools
import re

import pytest
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "rnnconvert"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path, known: set[str]) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every rnnconvert import in ``path``."""
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    local: dict[str, str] = {}  # names bound to rnnconvert modules
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "rnnconvert":
                    out.append((a.name, None, node.lineno))
                    if a.asname:
                        local[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rnnconvert":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in known:  # ``from pkg import module``
                    out.append((sub, None, node.lineno))
                    local[a.asname or a.name] = sub
                else:
                    out.append((target, a.name, node.lineno))
    for node in ast.walk(tree):  # ``module._name`` on an imported rnnconvert module is a private import too
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in local
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append((local[node.value.id], node.attr, node.lineno))
    return out


@functools.lru_cache(maxsize=None)  # read-only, parsed once per session (the quick tier's CPU, issue #38)
def _graph() -> tuple[dict[str, set[str]], list[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        for target, name, line in _imports(mod, path, known):
            if target in known and target != mod:
                # importing a package runs its __init__ only; a package's own modules are not its edges
                graph[mod].add(target)
            if name and name.startswith("_") and not name.startswith("__") and target != mod:
                private.append(f"{path.relative_to(PKG.parent)}:{line} imports {name} from {target}")
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
    cycles = _cycles(_graph()[0])
    assert not cycles, "import cycles between rnnconvert modules: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_name_imported_across_modules():
    private = _graph()[1]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_formats_do_not_import_the_registry_or_the_orchestration():
    """A format module is loaded by the registry; it may use core/, conventions/, safety/, speed/ and the engine's
    leaf helpers (protocol, refusal, stream, commit), never the registry, a runtime, verification, api or cli."""
    graph = _graph()[0]
    banned = {"rnnconvert.engine.registry", "rnnconvert.engine.matrix", "rnnconvert.api", "rnnconvert.cli",
              "rnnconvert.batch"}
    bad = [f"{m} imports {t}" for m, ts in graph.items() if m.startswith("rnnconvert.formats.")
           for t in ts if t in banned or t.startswith(("rnnconvert.verify", "rnnconvert.runtimes"))]
    assert not bad, "\n".join(bad)


def _family(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "formats" else None


def test_no_format_family_imports_another():
    """A format family is one folder; what two families share is a convention (rnnconvert/conventions/)."""
    graph = _graph()[0]
    bad = [f"{m} imports {t}" for m, ts in graph.items() for t in ts
           if _family(m) and _family(t) and _family(m) != _family(t)]
    assert not bad, "\n".join(bad)


def test_sniff_modules_are_light():
    """Detection runs every family's sniffer, so a sniff module imports only the package's light modules
    (errors, safety, speed, the conventions' name tables), never the rest of its family nor a framework."""
    graph = _graph()[0]
    light = ("rnnconvert.errors", "rnnconvert.safety", "rnnconvert.speed")
    bad = [f"{m} imports {t}" for m, ts in graph.items() if m.endswith(".sniff") and _family(m)
           for t in ts if not (t.startswith(light) or (t.startswith("rnnconvert.conventions.") and t.endswith("_names")))]
    assert not bad, "\n".join(bad)


def test_core_holds_no_performance_code():
    """core/ is the readable model and equations: no threads, no borrowing of loaded frameworks through
    sys.modules, no scratch buffers (the fast paths live in rnnconvert/speed/ and are passed in)."""
    bad = []
    for mod, path in _modules().items():
        if mod.startswith("rnnconvert.core."):
            text = path.read_text()
            for needle in ("import threading", "threading.local", "sys.modules", "O_DIRECT", "mmap"):
                if needle in text:
                    bad.append(f"{mod}: {needle}")
    assert not bad, "\n".join(bad)


def test_every_module_is_on_the_map():
    """docs/architecture.md's module map names every module of the package, and nothing that is gone."""
    import re

    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `(rnnconvert/[\w/]+\.py)` \|", doc, re.M))
    def code(p: Path) -> bool:  # a package __init__ is on the map when it holds more than a docstring
        body = ast.parse(p.read_text()).body
        return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)

    have = {str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py") if p.name != "__init__.py" or code(p)}
    assert not have - listed, f"modules missing from docs/architecture.md: {sorted(have - listed)}"
    assert not listed - have, f"docs/architecture.md lists modules that do not exist: {sorted(listed - have)}"


def test_nothing_below_whole_imports_it():
    """``rnnconvert/whole/`` (the whole-model compiler) is one room above formats/ and runtimes/: only the front
    door (api, cli, batch, the package) imports it; the records below name its operations by location
    (:func:`rnnconvert.engine.protocol.located`), loaded when a whole model is written or checked."""
    graph = _graph()[0]
    door = {"rnnconvert", "rnnconvert.api", "rnnconvert.cli", "rnnconvert.batch"}
    bad = [f"{m} imports {t}" for m, ts in graph.items() if not m.startswith("rnnconvert.whole") and m not in door
           for t in ts if t.startswith("rnnconvert.whole")]
    assert not bad, "\n".join(bad)


#: The rows of docs/architecture.md's house drawing, top to bottom: a module belongs to the row of its longest
#: prefix. engine/ stands in two rows: its orchestration above the rooms, its contracts (the leaf helpers the
#: formats and runtimes implement or call, importing only errors and core) among the foundations.
HOUSE = (
    ("front door", ("rnnconvert", "rnnconvert.api", "rnnconvert.cli", "rnnconvert.batch", "rnnconvert.__main__")),
    ("whole model", ("rnnconvert.whole",)),
    ("pipeline", ("rnnconvert.engine.pipeline", "rnnconvert.engine.registry", "rnnconvert.engine.matrix",
                  "rnnconvert.engine.checked", "rnnconvert.engine.finite", "rnnconvert.verify")),
    ("rooms", ("rnnconvert.formats", "rnnconvert.runtimes")),
    ("foundations", ("rnnconvert.engine", "rnnconvert.engine.protocol", "rnnconvert.engine.refusal",
                     "rnnconvert.engine.stream", "rnnconvert.engine.commit", "rnnconvert.conventions",
                     "rnnconvert.core", "rnnconvert.speed", "rnnconvert.safety", "rnnconvert.process",
                     "rnnconvert.errors")),
)


def _row(mod: str) -> int | None:
    hits = [(len(p), i) for i, (_, prefixes) in enumerate(HOUSE) for p in prefixes
            if mod == p or (mod.startswith(p + ".") and p != "rnnconvert")]
    return max(hits)[1] if hits else None


def test_the_house_has_no_arrow_running_up():
    """Every module stands in one row of the house drawing (docs/architecture.md, :data:`HOUSE`) and imports only
    modules of its own row or of rows below: no arrow runs back up (``whole/`` above formats/ and runtimes/, the
    engine's orchestration above the rooms, its contracts below them). The drawing names each row's engine
    modules, so a new engine module has to be placed in it."""
    graph = _graph()[0]
    unplaced = sorted(m for m in graph if _row(m) is None)
    assert not unplaced, f"modules in no row of the house: {unplaced}"
    up = [f"{m} ({HOUSE[_row(m)][0]}) imports {t} ({HOUSE[_row(t)][0]})" for m, ts in graph.items() for t in ts
          if _row(t) < _row(m)]
    assert not up, "arrows running up the house:\n" + "\n".join(sorted(up))
    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    drawing = doc.split("The house", 1)[1].split("```")[1]
    rows, current = {}, None
    for line in drawing.splitlines():
        label = line[:15].strip()
        if label:
            current = label
        if current and line.strip():
            rows.setdefault(current, "")
            rows[current] += line
    assert [r for r, _ in HOUSE] == list(rows), list(rows)
    for name, prefixes in HOUSE:
        for p in prefixes:
            if p.startswith("rnnconvert.engine."):
                assert p.rsplit(".", 1)[1] in rows[name], f"the drawing's {name} row does not name engine/{p}"


def _located() -> list[tuple[str, str]]:
    """``(module, "package.module:function")`` for every ``located("...")`` call of the package (ast)."""
    out = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "located"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.append((mod, node.args[0].value))
    return out


def test_every_located_operation_exists():
    """Each operation a record names by location (:func:`rnnconvert.engine.protocol.located`) is there: a rename or
    a move in ``whole/`` fails here, not on the first whole model a user converts."""
    import importlib

    found = _located()
    assert len(found) >= 4, found  # the onnx container's two, the onnxruntime and keras3 runtimes' verify_whole
    bad = []
    for mod, where in found:
        module, _, attr = where.partition(":")
        if not callable(getattr(importlib.import_module(module), attr, None)):
            bad.append(f"{mod}: located({where!r}) names nothing")
    assert not bad, "\n".join(bad)


_ROLE = re.compile(r":(mod|func|class):`([^`]+)`")


def _resolves(name: str) -> bool:
    """``name`` (``package.module.attr...``) is an importable module followed by attributes that exist."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for a in parts[i:]:
            if not hasattr(obj, a):
                return False
            obj = getattr(obj, a)
        return True
    return False


def _doc_refs(mod: str, path: Path):
    """``(role, target, candidates)`` for every ``:mod:``/``:func:``/``:class:`` reference in the docstrings of
    ``path``: absolute (``rnnconvert.x.y``), relative (``.x``: the module's own, then its package's) and bare names
    (the module's, its package's, or the enclosing class's); references to other distributions are left out."""
    import importlib.util

    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]

    def visit(node, cls):
        here = cls
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            here = node.name if isinstance(node, ast.ClassDef) else cls
            for role, t in _ROLE.findall(ast.get_docstring(node, clean=False) or ""):
                t = re.sub(r"\s+", "", t.split("<")[-1].rstrip(">")).lstrip("~!").removesuffix("()")
                top = t.split(".")[0]
                if t.startswith("rnnconvert"):
                    yield role, t, [t]
                elif t.startswith("."):
                    yield role, t, [mod + t, pkg + t]
                elif not ("." in t and importlib.util.find_spec(top) is not None):
                    yield role, t, [f"{mod}.{t}", f"{pkg}.{t}"] + ([f"{mod}.{here}.{t}"] if here else [])
        for child in ast.iter_child_nodes(node):
            yield from visit(child, here)

    yield from visit(ast.parse(path.read_text(), str(path)), None)


def test_docstring_cross_references_exist():
    """Every ``:mod:``/``:func:``/``:class:`` target named in a docstring of the package exists (modules imported,
    attributes looked up): a module renamed or moved leaves no reference to its old name behind."""
    bad, seen = [], 0
    for mod, path in _modules().items():
        if mod.endswith("__main__"):
            continue
        for role, t, cands in _doc_refs(mod, path):
            seen += 1
            if not any(_resolves(c) for c in cands):
                bad.append(f"{path.relative_to(PKG.parent)}: :{role}:`{t}`")
    assert seen > 500, seen  # the check reads the docstrings (about 1,100 references)
    assert not bad, f"{len(bad)} of {seen} docstring references name nothing:\n" + "\n".join(bad)


def test_the_reference_check_sees_a_stale_reference(tmp_path):
    """The check above can fail: a module whose docstring names a module that moved (``pt2_write``, now in
    ``whole/``), a function of its own that is gone and a relative name, next to ones that exist."""
    path = tmp_path / "made_up.py"
    path.write_text('"""See :mod:`rnnconvert.formats.torch.pt2_write`, :func:`gone`, :mod:`.nowhere`,\n'
                    ':func:`rnnconvert.engine.protocol.located` and :class:`.protocol.FormatSpec`."""\n')
    refs = list(_doc_refs("rnnconvert.engine.made_up", path))
    stale = [t for _, t, cands in refs if not any(_resolves(c) for c in cands)]
    assert stale == ["rnnconvert.formats.torch.pt2_write", "gone", ".nowhere"], stale


def test_every_container_names_registered_runtimes():
    """A runtime is declared once per framework (rnnconvert.runtimes.RUNTIMES); containers name them."""
    from rnnconvert import runtimes
    from rnnconvert.engine import registry

    for name, loc in runtimes.RUNTIMES.items():
        assert runtimes.get(name).name == name, loc
    for f in registry.FORMATS:
        spec = f.load()
        for rt in (spec.runtime, spec.equations, spec.framework):
            assert rt is None or rt in runtimes.RUNTIMES, (f.name, rt)


def test_core_is_numpy_only():
    """core/ (the model, gate tables, transforms, cuDNN layout, reference equations) imports nothing of
    the engine, io, formats or gpu."""
    graph = _graph()[0]
    bad = [f"{m} imports {t}" for m, ts in graph.items() if m.startswith("rnnconvert.core.")
           for t in ts if not (t.startswith("rnnconvert.core") or t == "rnnconvert.errors")]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_cycle_and_a_private_import(tmp_path):
    """The checks above can fail: a made-up pair of modules importing each other is a cycle."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_undefined_global_name():
    """Every global name a module uses is defined or imported in it (symtable): what a merge or a rename
    leaves behind (a function still calling a renamed ``_name``) fails here, not on the one input that
    reaches that line."""
    import builtins
    import symtable

    bad = []
    for mod, path in _modules().items():
        top = symtable.symtable(path.read_text(), str(path), "exec")
        defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
        defined |= set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__path__"}

        def walk(t):
            for s in t.get_symbols():
                if (s.is_global() or (t is top and s.is_referenced())) and s.get_name() not in defined:
                    bad.append(f"{mod}: {t.get_name()} uses undefined {s.get_name()}")
            for c in t.get_children():
                walk(c)

        walk(top)
    assert not bad, "\n".join(bad)


def test_each_family_naming_table_is_read_by_its_readers_and_writers():
    """One table of tensor names per family (docs/architecture.md), read by both sides: a reader or writer
    that spells the names itself no longer imports its table."""
    graph = _graph()[0]
    users = {"rnnconvert.formats.tf.naming": [
                 "rnnconvert.formats.tf." + m for m in ("tf1_cells", "checkpoint_read", "graph_read", "tf1_write", "tf2_write")]
             + ["rnnconvert.verify.tf1_equations"],
             "rnnconvert.conventions.torch_names": [
                 "rnnconvert.conventions.torch_state", "rnnconvert.formats.torch.pt_read", "rnnconvert.formats.torch.pt_write",
                 "rnnconvert.formats.storage.safetensors_fmt", "rnnconvert.runtimes.torch"]}
    missing = [f"{m} does not import {table}" for table, mods in users.items() for m in mods if table not in graph[m]]
    assert not missing, "\n".join(missing)


_TRACE = r'''
import json, sys, threading
edges = set()
def passed_in(frame):
    """Whether the called function is one the calling function was handed as an argument (a callback such as
    speed.parallel.run's piece): a call of the caller's own callable, not a call into the callee's module."""
    back = frame.f_back
    code = back.f_code
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
    args = [back.f_locals.get(a) for a in code.co_varnames[:n]]
    args += [v for a in args if isinstance(a, (tuple, dict)) for v in (a.values() if isinstance(a, dict) else a)]
    return any(getattr(getattr(a, "__func__", a), "__code__", None) is frame.f_code for a in args)
def prof(frame, event, arg):
    if event != "call" or frame.f_back is None:
        return
    callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
    if (callee != caller and callee.startswith("rnnconvert") and caller.startswith("rnnconvert")
            and not passed_in(frame)):
        edges.add((caller, callee))
sys.setprofile(prof); threading.setprofile(prof)
import rnnconvert
rnnconvert.convert(sys.argv[1], sys.argv[2])
sys.setprofile(None); threading.setprofile(None)
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("rnnconvert.")), "edges": sorted(edges),
                  "package": rnnconvert.__file__}))
'''


#: pairs that call both ways because one hands the other a callable of its own (the tracer sees the callee's module
#: calling back): the whole-model compiler's, and verification's float32 evaluation orders (issue #39: the one-step
#: comparison's measured tolerance), each named with its call
_CALLBACKS = {
    ("rnnconvert.core.reference", "rnnconvert.verify.orders"):
        "reference.step(..., kernels=orders._kernels(products), acts=orders._ulp_off(rng))",
    ("rnnconvert.whole.conventions.keras_graph", "rnnconvert.whole.formats.onnx.model_write"):
        "keras_graph.from_config(model_write.build, graph)",
    ("rnnconvert.whole.runtimes.onnx_whole", "rnnconvert.whole.verify.keras_whole_check"):
        "keras_whole_check.compare_whole(..., target, run64=..., run32=...)",
}


@pytest.mark.parametrize("src,dst,families,whole", [
    ("keras/cudnn_lstm.h5", "out.pt", {"keras", "torch"}, False),
    ("tf/lstm_cell/ckpt", "out.onnx", {"tf", "onnx"}, False),
    ("src.pt", "out.safetensors", {"torch", "storage"}, False),
    ("src.pt", "out.onnx", {"torch", "onnx"}, False),
    ("whole_graph/whole30_embed_conv_lstm.h5", "out.onnx", {"keras", "onnx"}, True),
], ids=["keras-pt", "tf1-onnx", "pt-safetensors", "pt-onnx", "keras-whole-onnx"])
def test_a_traced_conversion_uses_only_its_families_and_no_module_pair_calls_both_ways(src, dst, families, whole,
                                                                                       tmp_path):
    """A verified default conversion, traced (every call between two rnnconvert modules, in every thread): it
    imports of the format families only the two it reads and writes (every family's light ``sniff`` module
    aside: detection asks them all), nothing of ``rnnconvert/whole/`` unless it writes a whole model (then its
    ONNX writer and check), and no two modules call each other both ways (a callback or a shared
    helper living in the wrong module shows up as such a pair)."""
    import json
    import subprocess
    import sys

    fixtures = PKG.parent / "fixtures"
    if src == "src.pt":
        import rnnconvert

        rnnconvert.convert(fixtures / "keras" / "bidi_lstm_concat.h5", tmp_path / "src.pt", verify=None)
        path = tmp_path / "src.pt"
    else:
        path = fixtures / src
    import os

    # the package of this checkout (not an installed copy) is the one traced
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PKG.parent), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", _TRACE, str(path), str(tmp_path / dst)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["package"] == str(PKG / "__init__.py"), got["package"]
    used = {m.split(".")[2] for m in got["modules"] if m.count(".") >= 3 and m.startswith("rnnconvert.formats.")
            and not m.endswith(".sniff")}
    assert used == families, used
    wing = sorted(m for m in got["modules"] if m.startswith("rnnconvert.whole"))
    if whole:
        assert {"rnnconvert.whole.formats.onnx.model_write", "rnnconvert.whole.runtimes.onnx_whole"} <= set(wing), wing
    else:
        assert not wing, f"a conversion of recurrent layers imported the whole-model compiler: {wing}"
    edges = {tuple(e) for e in got["edges"]}
    both = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges} - set(_CALLBACKS))
    assert not both, f"module pairs calling each other both ways: {both}"


_LIGHT = r'''
import json, sys
import rnnconvert
after_import = sorted(m for m in sys.modules if m.startswith("rnnconvert"))
numpy_on_import = "numpy" in sys.modules
from rnnconvert import cli
rc = cli.main(["--help"])
print(json.dumps({"import": after_import, "numpy_import": numpy_on_import, "rc": rc, "numpy_help": "numpy" in sys.modules,
                  "help": sorted(m for m in sys.modules if m.startswith("rnnconvert"))}))
'''


def test_import_and_help_are_light():
    """``import rnnconvert`` and ``rnnconvert --help`` import neither numpy nor a format, runtime, verification or
    whole-model module (the package's names load on first use, PEP 562; the CLI imports ``api`` in its commands)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PKG.parent), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", _LIGHT], capture_output=True, text=True, env=env, timeout=120)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and not got["numpy_import"] and not got["numpy_help"], got
    heavy = ("rnnconvert.api", "rnnconvert.formats", "rnnconvert.runtimes", "rnnconvert.verify", "rnnconvert.whole",
             "rnnconvert.engine", "rnnconvert.core")
    assert got["import"] == ["rnnconvert"], got["import"]
    assert not [m for m in got["help"] if m.startswith(heavy)], got["help"]


def test_every_error_and_report_type_is_exported():
    """Every exception of rnnconvert/errors.py and the report types are names of ``rnnconvert`` (in ``__all__``),
    loaded on first use."""
    import inspect

    import rnnconvert
    from rnnconvert import errors

    errs = {n for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.RNNConvertError)}
    public = errs | {"VerifyReport", "LayerCheck", "ConversionReport", "DiagnosisReport"}
    assert public <= set(rnnconvert.__all__), sorted(public - set(rnnconvert.__all__))
    for name in rnnconvert.__all__:
        assert getattr(rnnconvert, name) is not None, name
    assert rnnconvert.InconclusiveError is errors.InconclusiveError


#: the longest function (lines, ``end_lineno - lineno + 1``, decorators not counted) of rnnconvert/verify/ (issue #38)
VERIFY_MAX_LINES = 80


def test_no_long_function_in_verify():
    """No function or method in rnnconvert/verify/ is longer than :data:`VERIFY_MAX_LINES` lines (issue #38: the
    verification engine split into parts a newcomer can read)."""
    long = []
    for path in sorted((PKG / "verify").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > VERIFY_MAX_LINES:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)
