"""Read recurrent weights a project pickled as plain numpy arrays (``pickle.dump`` of a dict of arrays, nested
dicts/lists/tuples of them, or the project's own network objects made of arrays) without importing or running
anything the file names.

Layout facts (``pickletools.dis`` of ``pickle.dumps`` output, numpy 2.4 and 1.x, protocols 0-5): a numpy array is
``numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')`` followed by ``BUILD`` with the state
``(version, shape, dtype, is_fortran, rawdata)`` (``ndarray.__reduce__``/``__setstate__``, numpy
``_core/src/multiarray/methods.c``); from protocol 5 a contiguous array is ``numpy._core.numeric._frombuffer(
buffer, dtype, shape, order)``; a dtype is ``numpy.dtype(spec, align, copy)`` then ``BUILD`` with ``(3, byteorder,
subarray, names, fields, elsize, alignment, flags)``; a numpy scalar ``numpy._core.multiarray.scalar(dtype, bytes)``;
numpy 1.x pickles name ``numpy.core.*`` instead of ``numpy._core.*``. Protocol < 3 stores ``bytes`` as
``_codecs.encode(str, 'latin1')``. An instance of a class ``C`` is ``C.__new__(C, *args)`` (``NEWOBJ``, protocol 2+)
or ``copyreg._reconstructor(C, object, None)`` (protocol 0/1), then ``BUILD`` with its ``__dict__`` (or
``(__dict__, slots)``), list items by ``APPENDS``, dict items by ``SETITEMS``.

:class:`Unpickler` resolves only that allow-list, and each to a stand-in of ours, never to the real function:

* the numpy names above -> records that build the array from the bytes with ``np.frombuffer`` after checking
  that the dtype is a plain number (``f2 f4 f8 i1..i8 u1..u8 b1``: no object arrays, no structured dtypes) and
  that the shape matches the bytes exactly (nothing is expanded);
* ``collections.OrderedDict``, ``collections.defaultdict`` (a plain dict: its factory is never called),
  ``builtins.object``, the builtin containers and numbers (``set frozenset bytearray bytes complex list dict
  tuple int float bool str``: called with no argument or one plain value only, never a size),
  ``copyreg._reconstructor`` (ours: a stand-in instance), ``_codecs.encode`` (``str`` to ``latin1`` bytes only);
* any other ``module.Name`` outside Python's standard library and the frameworks below -> a :class:`Record`
  class made on the spot (its module is never imported): calling it, ``NEWOBJ``, ``BUILD``, ``APPENDS``,
  ``SETITEMS`` only record what the file gives.

Refused with one line (:class:`~rnnconvert.errors.FormatError`, nothing executed): every other global of Python's
standard library (``os.system``, ``builtins.eval``, ``subprocess.Popen``, ``importlib.import_module``, ...), every
numpy name off the allow-list (``numpy.load``, ``numpy.lib.npyio``, ``numpy.testing``, ...), object and structured
dtypes, a numpy subclass (``numpy.ma``, ``numpy.matrix``), and globals of frameworks with their own formats
(``torch``: save with ``torch.save`` and read the ``.pt``; ``tensorflow``, ``jax``, ``paddle``).

Bounded before the unpickler runs by :func:`rnnconvert.safety.pickle_scan.scan` (object size with memo re-uses
counted where used, nesting, memo indices, hashed keys), and after it by the budget (:mod:`rnnconvert.safety.budget`): the walk over the unpickled tree counts containers and
names against ``pickle_nodes`` (shared children are walked once), arrays against ``names``; an array's bytes
are the file's own (no expansion). Tensors are named by their path: dict keys, attribute names and list indices
joined with ``.`` (``encoder.weight_ih_l0``, ``layers.0.Wx``); the names then go through the foreign-name table
(:mod:`rnnconvert.core.names`, ``--map``). A Haiku parameter tree (``{module: {param: array}}`` with a core by
Haiku's names, or named by ``cells=``) is read by Haiku's convention instead (:mod:`rnnconvert.conventions.haiku_params`);
pickle ``jax.device_get(params)``, as a ``jax.Array`` is refused like every framework global.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ...conventions import haiku_names, haiku_params, madmom_layers
from ...core import names
from ...core.model import Checkpoint
from ...errors import FormatError
from ...safety import budget
from ...safety import pickle_scan
from ...safety.pickle_scan import brief

#: dtypes an array may have (numpy type strings without byte order)
DTYPES = frozenset({"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"})
#: the numpy globals a pickled array, dtype or scalar names (numpy 2 ``_core``, numpy 1 ``core``)
NUMPY_NAMES = {
    **{(f"numpy.{c}.multiarray", "_reconstruct"): "reconstruct" for c in ("_core", "core")},
    **{(f"numpy.{c}.multiarray", "scalar"): "scalar" for c in ("_core", "core")},
    **{(f"numpy.{c}.numeric", "_frombuffer"): "frombuffer" for c in ("_core", "core")},
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
}
#: module roots refused outright: frameworks with formats of their own (their objects are no plain arrays)
FRAMEWORKS = {"torch": "save it with torch.save and read the .pt", "tensorflow": "", "keras": "", "tf_keras": "",
              "jax": "", "jaxlib": "", "paddle": "", "mlx": "", "openvino": "", "numpy": ""}
MAX_DEPTH = 64
#: names of tensors that hold a learned initial state (``h0``, ``c0``, ``init_h``, ``initial_state``, ...)
INITIAL = re.compile(r"(^|[._/-])(h_?0|c_?0|init(ial)?_?(h|c|hidden|cell|state)s?|(h|c|hidden|cell)_?init(ial)?)"
                     r"($|[._/-])", re.IGNORECASE)


class Record:
    """An instance of a class the pickle names, never imported: ``cls_path`` (``module.Name``), the arguments
    it was made with (``args``, ``kwargs``), its ``state`` (``BUILD``), and ``items`` (``APPENDS``) /
    ``entries`` (``SETITEMS``) when it was a list or dict subclass."""

    cls_path = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Record":
        self = object.__new__(cls)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)
        object.__setattr__(self, "state", None)
        object.__setattr__(self, "items", [])
        object.__setattr__(self, "entries", {})
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        object.__setattr__(self, "state", state)

    def __setattr__(self, key: str, value: Any) -> None:  # BUILD's slot-state path: recorded like a dict
        self.entries[key] = value

    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.entries[key] = value

    def __repr__(self) -> str:
        return f"<{self.cls_path} (not imported)>"

    def attributes(self) -> dict | None:
        """The instance's attributes as ``BUILD`` gave them: its ``__dict__`` state (or ``(__dict__, slots)``
        merged), then attributes set one by one; those alone when the state is no dict; ``None`` when it has
        neither."""
        st = _merged(self.state)
        if isinstance(st, dict):
            return {**st, **{k: v for k, v in self.entries.items() if isinstance(k, str)}}
        return dict(self.entries) if self.entries else None


def _merged(state: Any) -> Any:
    """A ``BUILD`` state ``(__dict__, slots)`` as one dict; any other state as it is."""
    if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
        return {**(state[0] or {}), **(state[1] or {})}
    return state


class _NdarrayClass:
    """Stands for ``numpy.ndarray`` (the first argument of ``_reconstruct``)."""


class DtypeRecord:
    """``numpy.dtype(spec, align, copy)`` and its ``BUILD`` state, checked: a plain number type only."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = False) -> None:
        if not isinstance(spec, str) or spec not in DTYPES:
            raise FormatError(f"numpy dtype {brief(spec, 40)}: only plain number arrays are read ({' '.join(sorted(DTYPES))}); refused")
        self.spec, self.order = spec, "|" if spec in ("i1", "u1", "b1") else "<"

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) >= 4 and state[1] in ("<", ">", "|", "=")
                and state[2] is None and state[3] is None):
            raise FormatError(f"numpy dtype state {brief(state, 60)} (subarray or structured dtypes are not read)")
        self.order = state[1]

    def dtype(self) -> np.dtype:
        return np.dtype(("<" if self.order in ("=", "|") and sys.byteorder == "little" else
                         ">" if self.order in ("=", "|") else self.order) + self.spec)


def _shape(v: Any) -> tuple[int, ...]:
    if not (isinstance(v, tuple) and len(v) <= 32 and all(type(n) is int and n >= 0 for n in v)):
        raise FormatError(f"malformed array shape {brief(v, 60)}")
    return v


def _array(raw: Any, dt: Any, shape: Any, fortran: bool) -> np.ndarray:
    """A native-order C-contiguous copy of ``raw`` read as ``shape`` of ``dt``; the byte count must match."""
    if not isinstance(dt, DtypeRecord):
        raise FormatError(f"array dtype {brief(dt, 40)} is no numpy dtype")
    shape = _shape(shape)
    if isinstance(raw, str):  # a Python 2 pickle's str (read as latin1)
        raw = raw.encode("latin1")
    if isinstance(raw, pickle.PickleBuffer):
        raw = raw.raw()
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise FormatError("array data that is not bytes (an object array?); refused")
    d = dt.dtype()
    n = 1
    for s in shape:
        n *= s
    if n * d.itemsize != len(raw):
        raise FormatError(f"an array of shape {shape} {d} needs {n * d.itemsize} bytes, its record holds {len(raw)}")
    a = np.frombuffer(raw, dtype=d, count=n).reshape(shape, order="F" if fortran else "C")
    return np.array(a, dtype=d.newbyteorder("="), order="C", copy=True)


class ArrayRecord:
    """``_reconstruct(ndarray, (0,), b'b')``: the array comes with ``BUILD`` (:meth:`__setstate__`)."""

    def __init__(self, cls: Any, shape: Any = None, typecode: Any = None) -> None:
        if cls is not _NdarrayClass:
            raise FormatError(f"a numpy array subclass ({brief(cls, 60)}); only plain numpy arrays are read")
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4):
            raise FormatError(f"malformed numpy array state {brief(state, 60)}")
        shape, dt, fortran, raw = state
        self.array = _array(raw, dt, shape, bool(fortran))


def _frombuffer(buf: Any, dt: Any, shape: Any, order: Any = "C") -> np.ndarray:
    return _array(buf, dt, shape, order == "F")


def _scalar(dt: Any, data: Any = None) -> np.ndarray:
    return _array(data, dt, (), False)


def _codecs_encode(s: Any, encoding: Any = "utf-8", *rest: Any) -> bytes:
    if rest or not isinstance(s, str) or encoding != "latin1":
        raise FormatError("_codecs.encode with arguments other than (str, 'latin1')")
    return s.encode("latin1")


#: types whose call on a container would walk all of it (``str(x)`` formats the whole tree)
_SCALARS = (str, bytes, bytearray, int, float, complex, bool)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)


def _ctor(kind: type):
    """A builtin container/number type as a pickle may call it: with no argument or one plain value, never an
    integer size (``bytearray(10**12)`` would allocate a terabyte)."""
    def make(*args: Any) -> Any:
        if not args:
            return kind()
        if kind in (bytes, bytearray) and len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
            return kind(args[0].encode("latin1"))
        if len(args) != 1 or not isinstance(args[0], _PLAIN) or (isinstance(args[0], int) and kind in (bytes, bytearray, str)) \
                or (kind in _SCALARS and isinstance(args[0], (list, tuple, dict, set, frozenset))):
            raise FormatError(f"builtins.{kind.__name__} called with {len(args)} argument(s) of "
                              f"{', '.join(type(a).__name__ for a in args)}; refused")
        return kind(args[0])
    return make


def _defaultdict(factory: Any = None, *rest: Any) -> dict:
    """``collections.defaultdict(factory)``: a plain dict (the factory is never called)."""
    return {}


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, Record)) or base is not object or state is not None:
        raise FormatError(f"copyreg._reconstructor of {brief(cls, 60)} on {brief(base, 40)}")
    return cls()


SAFE = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "object"): object, ("__builtin__", "object"): object,
    **{(m, k.__name__): _ctor(k) for m in ("builtins", "__builtin__")
       for k in (set, frozenset, bytearray, bytes, complex, list, dict, tuple, int, float, bool, str)},
    ("collections", "defaultdict"): _defaultdict,
    ("copyreg", "_reconstructor"): _reconstructor, ("copy_reg", "_reconstructor"): _reconstructor,
    ("_codecs", "encode"): _codecs_encode,
}
NUMPY = {"reconstruct": ArrayRecord, "scalar": _scalar, "frombuffer": _frombuffer, "ndarray": _NdarrayClass,
         "dtype": DtypeRecord}
STDLIB = frozenset(sys.stdlib_module_names) | {"__builtin__", "copy_reg", "__main__builtins"}


class Unpickler(pickle.Unpickler):
    """The allow-list unpickler (module docstring): numpy arrays, containers, inert :class:`Record` classes."""

    def __init__(self, fh: Any) -> None:
        super().__init__(fh, encoding="latin1")
        self.classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise FormatError("malformed global")
        if (module, name) in SAFE:
            return SAFE[(module, name)]
        if (module, name) in NUMPY_NAMES:
            return NUMPY[NUMPY_NAMES[(module, name)]]
        root = module.split(".")[0]
        if root in STDLIB:
            raise FormatError(f"the pickle names '{module}.{name}' (Python code, not data); refused, nothing was run")
        if root in FRAMEWORKS:
            how = FRAMEWORKS[root]
            raise FormatError(f"the pickle names '{module}.{name}', which is not on the allow-list of plain numpy "
                              f"arrays; refused, nothing was run{f' ({how})' if how else ''}")
        if not re.fullmatch(r"[A-Za-z_][\w.]*", module) or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
            raise FormatError(f"malformed global name {brief(module, 60)}.{brief(name, 60)}")
        key = (module, name)
        if key not in self.classes:  # an inert stand-in: the module is never imported
            self.classes[key] = type(name.split(".")[-1], (Record,), {"cls_path": f"{module}.{name}"})
        return self.classes[key]

    def persistent_load(self, pid: Any) -> Any:
        raise FormatError(f"persistent id {brief(pid, 60)} (data outside the pickle); refused")


def _children(o: Any) -> list[tuple[str, Any]] | None:
    """The named children of a container or :class:`Record`; ``None`` for a leaf."""
    if isinstance(o, dict):
        return [(str(k), v) for k, v in o.items()]
    if isinstance(o, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(o)]
    if isinstance(o, Record):
        out: list[tuple[str, Any]] = []
        st = _merged(o.state)
        if isinstance(st, dict):
            out += [(str(k), v) for k, v in st.items()]
        elif st is not None:
            out.append(("state", st))
        out += [(str(k), v) for k, v in o.entries.items()]
        out += [(str(i), v) for i, v in enumerate(o.items)]
        if o.args:
            out += [(str(i), v) for i, v in enumerate(o.args)] if not out else [("args", list(o.args))]
        return out
    return None


def arrays(obj: Any, where: object) -> dict[str, np.ndarray]:
    """The numpy arrays of an unpickled tree by path (keys, attribute names, indices joined with ``.``), each
    container walked once (shared children cost nothing twice) within the ``pickle_nodes`` budget.

    Raises:
        FormatError: nesting deeper than :data:`MAX_DEPTH` (a cycle ends there too), an array record never
        given its state. BudgetError: the walk's or the name count's limit."""
    count = budget.Counter(where, "pickle_nodes", "containers and tensor names in the pickle")
    memo: dict[int, list[tuple[str, np.ndarray]]] = {}
    keep: list[Any] = []

    def walk(o: Any, depth: int) -> list[tuple[str, np.ndarray]]:
        count.tick()
        if isinstance(o, ArrayRecord):
            if o.array is None:
                raise FormatError(f"{where}: a numpy array record without its data")
            return [("", o.array)]
        if isinstance(o, np.ndarray):
            return [("", o)]
        got = memo.get(id(o))
        if got is not None:
            return got
        kids = _children(o)
        if kids is None:
            return []
        if depth > MAX_DEPTH:
            raise FormatError(f"{where}: containers nested deeper than {MAX_DEPTH} levels")
        res: list[tuple[str, np.ndarray]] = []
        for k, v in kids:
            sub = walk(v, depth + 1)
            count.tick(len(sub))
            res.extend((f"{k}.{rel}" if rel else k, a) for rel, a in sub)
        memo[id(o)] = res
        keep.append(o)
        return res

    found = walk(obj, 0)
    budget.check_count(where, "names", len(found), "arrays")
    out: dict[str, np.ndarray] = {}
    for k, a in found:
        k = k or "array"  # the pickle is one array
        if k in out:
            raise FormatError(f"{where}: two arrays under the name '{k}' (dict keys that print alike)")
        out[k] = a
    return out


def load_tree(path: str | Path) -> Any:
    """Unpickle ``path`` with :class:`Unpickler` (nothing the file names is imported or run).

    The file is read once into memory; those bytes are checked by :func:`rnnconvert.safety.pickle_scan.scan`
    (expanded size, nesting, memo, hashed keys) and then unpickled, so a file changed between the two steps
    cannot slip an unscanned stream to the unpickler.

    Raises:
        FormatError: a global off the allow-list (named), a damaged or truncated pickle, trailing garbage, a
        structure :mod:`~rnnconvert.safety.pickle_scan` refuses. BudgetError: the ``pickle_expanded`` limit."""
    p = Path(path)
    budget.regular_source(p, dirs=False)
    try:
        with open(p, "rb") as fh:  # one read: the scan and the unpickler see the same bytes, whatever
            data = fh.read()       # happens to the file meanwhile (no second read to swap it under)
        if not data:
            raise FormatError(f"{p}: empty file; not a pickle")
        end = pickle_scan.scan(data, p, 0)  # structure bounded before the unpickler runs
        if end != len(data):
            raise FormatError(f"{p}: data after the pickle's STOP opcode; refused")
        tree = Unpickler(io.BytesIO(data)).load()
        del data
    except FormatError as exc:
        msg = str(exc)
        raise type(exc)(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
    except RecursionError:
        raise FormatError(f"{p}: pickle nested too deeply") from None
    except MemoryError:
        raise FormatError(f"{p}: the pickle asks for more memory than there is; refused") from None
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # a damaged stream: UnpicklingError, EOFError, TypeError, ValueError, ...
        raise FormatError(f"{p}: not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None
    return tree


def _leaf_array(v: Any) -> np.ndarray | None:
    """The array an unpickled leaf holds, ``None`` for anything else."""
    if isinstance(v, ArrayRecord):
        return v.array
    return v if isinstance(v, np.ndarray) else None


def _haiku_tree(tree: Any, tensors: dict[str, np.ndarray], cells: Any) -> dict | None:
    """The Haiku modules of a pickled ``{module: {param: array}}`` (a Haiku parameter tree, e.g.
    ``pickle.dump(jax.device_get(params))``) holding a core by Haiku's names or ``cells``, else ``None``."""
    if not (isinstance(tree, dict) and tree and all(
            isinstance(k, str) and isinstance(v, dict) and v
            and all(isinstance(p, str) and isinstance(a, (ArrayRecord, np.ndarray)) for p, a in v.items())
            for k, v in tree.items())):
        return None
    mods = {k: {p: tensors[f"{k}.{p}"] for p in v} for k, v in tree.items()}
    return mods if haiku_names.cores({m: set(d) for m, d in mods.items()}, cells) else None


def read(path: str | Path, nonlinearity: str | None = None, map: Any = None, cells: Any = None) -> Checkpoint:
    """Read a pickle of numpy arrays into canonical layers through the foreign-name table.

    Args:
        path: a ``.pkl``/``.pickle`` file (any protocol).
        nonlinearity: a simple RNN's activation (no file stores it). map: ``--map`` items
            (:func:`rnnconvert.core.names.parse_map`). cells: Haiku cores under other than Haiku's
            default names (:func:`rnnconvert.conventions.haiku_names.parse_cells`).

    Returns:
        a class-structured network (madmom's ``NeuralNetwork`` of ``LSTMLayer``/``GRULayer``/``RecurrentLayer``/
        ``BidirectionalLayer`` objects with per-gate ``Gate`` objects) by madmom's equations
        (:mod:`rnnconvert.conventions.madmom_layers`: peepholes, the GRU update gate inverted, learned initial
        states carried) when no ``map`` is given; a Haiku parameter tree's cores by Haiku's equations (:mod:`rnnconvert.conventions.haiku_params`: LSTM
        forget bias 1, GRU update gate inverted, VanillaRNN ReLU) when the pickle is one and no ``map`` is given;
        otherwise the layers :func:`rnnconvert.core.names.recognise` finds among the arrays named by their path, every
        other array as a carried tensor; arrays holding a learned initial state (``h0``, ``c0``, ``init_h``,
        ``initial_state``, ...) are carried as tensors too and named in ``meta['notes']`` (no target format's
        layer takes them yet).

    Raises:
        FormatError: see :func:`load_tree` and :func:`arrays`; no recurrent weights (with ``--map``'s hint).
    """
    tree = load_tree(path)
    tensors = arrays(tree, path)
    if map is None and cells is None and madmom_layers.is_network(tree, Record):  # madmom's per-gate objects
        return madmom_layers.read(tree, str(path), "pickle", Record, _leaf_array)
    haiku = _haiku_tree(tree, tensors, cells) if map is None else None
    if haiku is not None:  # hk.transform(f).init's {module: {param: array}}: Haiku's own equations
        return haiku_params.read(haiku, str(path), "pickle", cells)
    if cells is not None:
        raise FormatError(f"{path}: cells= names Haiku cores, and this pickle is no Haiku parameter tree "
                          "({module: {param: array}})")
    ckpt = names.recognise(tensors, str(path), "pickle", map=map, nonlinearity=nonlinearity or "tanh")
    meta, tensors, moved = dict(ckpt.meta), {}, []
    layer_names = {layer.name for layer in ckpt.layers}
    for k, v in ckpt.tensors.items():
        head, _, rest = k.partition(".")
        if INITIAL.search(k) and rest and head in layer_names:  # out of the layer's state-dict namespace
            moved.append(f"{k} as {head}_state.{rest}")
            k = f"{head}_state.{rest}"
        elif INITIAL.search(k):
            moved.append(k)
        if k in tensors:
            raise FormatError(f"{path}: two tensors named '{k}'")
        tensors[k] = v
    if moved:
        meta["notes"] = [f"learned initial state(s) {', '.join(moved)} carried as extra tensors, not applied: the "
                         "written layers start from zero states (feed them as the initial state when running it; "
                         "the ONNX writer does not write initial_h/initial_c yet)"]
    return Checkpoint(format=ckpt.format, layers=ckpt.layers, tensors=tensors, meta=meta)
