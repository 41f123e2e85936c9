"""Bound a pickle's structure *before* any unpickler runs, and format untrusted values in bounded messages.

An allow-list ``find_class`` keeps code out of an unpickler, not work: Python's C unpickler hashes every dict key
and set element inside one C call, and a 1 KB pickle can make a key of 2**64 leaves (a tuple holding the
memoised tuple twice, 64 levels: ``BINGET`` re-uses an object at no cost to the file); no signal handler runs
until that call ends. The same DAG built of lists costs nothing to build and everything to ``repr``.

:func:`scan` walks the opcodes once (``pickletools`` opcode table, Python's ``Lib/pickle.py`` and
``Modules/_pickle.c`` for each opcode's stack effect), linear in the stream's size (byte arguments are skipped,
not read), with a simulated stack and memo of small records, and refuses with one line before the unpickler runs:

* an object whose *expanded* size (the tree the DAG stands for: each memo re-use ``GET``/``BINGET``/
  ``LONG_BINGET`` counted at the full size of what it re-uses) passes the ``pickle_expanded`` budget limit
  (:class:`~rnnconvert.errors.BudgetError`);
* nesting deeper than :data:`MAX_DEPTH`, a memo index above the objects made so far (the C unpickler
  allocates a memo table as large as the index), a container changed after it was put into another one (which
  would make the sizes above stale: only recursive structures do that, and every reader refuses them);
* a dict key or set element that is a list, dict or set, or any key of more than :data:`MAX_KEY` expanded
  nodes (``SETITEM``/``SETITEMS``/``DICT``, ``ADDITEMS``/``FROZENSET``, and calls of globals named ``set``,
  ``frozenset``, ``dict``, ``OrderedDict``, ``Counter``, which hash what they are given);
* a damaged stream (unknown opcode, stack underflow, a missing mark or memo entry, an argument past the end).

It returns the offset just after ``STOP``: callers refuse data after it where the format has none.

:func:`brief` is the only way an untrusted value enters a message: a bounded walk (a few levels, a few items
per container, strings cut) that never calls the value's own ``__repr__`` and ends within a fixed number of steps
whatever the value shares.
"""

from __future__ import annotations

import struct
from typing import Any

from ..errors import BudgetError, FormatError
from . import budget

#: nesting depth refused (the expanded tree's, counting argument tuples and state dicts)
MAX_DEPTH = 200
#: expanded nodes a dict key or set element may have (a small tuple: ``('lstm', 0)``)
MAX_KEY = 64
#: text arguments (``GLOBAL`` names, ``PERSID``) longer than this are refused
MAX_LINE = 1 << 16
#: the names of callables that hash what they are given
HASHING = frozenset({"set", "frozenset", "dict", "OrderedDict", "Counter", "defaultdict"})

_ATOM, _TUPLE, _LIST, _DICT, _SET, _FROZENSET, _OBJ, _GLOBAL = range(8)
_KIND = {_TUPLE: "tuple", _LIST: "list", _DICT: "dict", _SET: "set", _FROZENSET: "frozenset", _OBJ: "object",
         _GLOBAL: "global", _ATOM: "value"}


class _Node:
    """One object of the simulated stack: kind, expanded size, depth, the largest child (``kid``) and
    grandchild (``kid2``, ``kid3``) sizes, whether it was put into another object (``frozen``), a global's name
    (``text``). Numbers and constants share one leaf (:data:`_ATOM_NODE`), short strings are :class:`_Text`."""

    __slots__ = ("kind", "size", "depth", "kid", "kid2", "kid3", "frozen", "text")

    def __init__(self, kind: int, text: str | None = None) -> None:
        self.kind, self.size, self.depth, self.kid, self.kid2, self.kid3 = kind, 1, 0, 0, 0, 0
        self.frozen, self.text = False, text


class _Text:
    """A leaf that keeps the UTF-8 bytes of a short string (one a ``STACK_GLOBAL`` may name)."""

    __slots__ = ("raw",)
    kind, size, depth, kid, kid2, kid3, frozen = _ATOM, 1, 0, 0, 0, 0, False

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @property
    def text(self) -> str:
        return bytes(self.raw).decode("utf-8", "replace")


class _Scan:
    def __init__(self, buf: Any, start: int, end: int, where: object) -> None:
        self.buf, self.pos, self.end, self.where = buf, start, end, where
        self.stack: list[_Node] = []
        self.marks: list[int] = []
        self.memo: dict[int, _Node] = {}
        self.made = 0
        self.cap = budget.limit("pickle_expanded")

    # -- errors ---------------------------------------------------------------------------------------------
    def bad(self, why: str) -> FormatError:
        return FormatError(f"{self.where}: not a readable pickle ({why} at byte {self.pos}); refused before "
                           "unpickling (rnnconvert never runs code from a file)")

    # -- reading arguments ----------------------------------------------------------------------------------
    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise self.bad(f"an argument of {n} bytes past the end of the data")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise self.bad(f"an argument of {n:,} bytes past the end of the data")
        self.pos += n

    def line(self) -> bytes:
        i = self.buf.find(b"\n", self.pos, min(self.end, self.pos + MAX_LINE + 1))
        if i < 0:
            if self.end - self.pos > MAX_LINE:  # a long text argument (protocol 0 STRING/UNICODE): find its end
                i = self.buf.find(b"\n", self.pos, self.end)
            if i < 0:
                raise self.bad("a text argument without its newline")
        b = bytes(self.buf[self.pos:i]) if i - self.pos <= MAX_LINE else b""
        self.pos = i + 1
        return b

    def index(self, raw: bytes) -> int:
        try:
            return int(raw)
        except ValueError:
            raise self.bad("a memo index that is not a number") from None

    # -- the stack -------------------------------------------------------------------------------------------
    def fence(self) -> int:
        return self.marks[-1] if self.marks else 0

    def pop(self) -> _Node:
        if len(self.stack) <= self.fence():
            raise self.bad("stack underflow")
        return self.stack.pop()

    def peek(self) -> _Node:
        if len(self.stack) <= self.fence():
            raise self.bad("stack underflow")
        return self.stack[-1]

    def to_mark(self) -> list[_Node]:
        if not self.marks:
            raise self.bad("no MARK before an opcode that needs one")
        m = self.marks.pop()
        items = self.stack[m:]
        del self.stack[m:]
        return items

    def push(self, n: _Node) -> None:
        self.stack.append(n)
        self.made += 1

    # -- sizes -----------------------------------------------------------------------------------------------
    def add(self, parent: _Node, kids: list[_Node]) -> _Node:
        """Put ``kids`` into ``parent`` (a new container, or one being filled), updating its sizes."""
        if not kids:  # an empty APPENDS/SETITEMS changes nothing (the C unpickler does not look at its target)
            return parent
        if parent.kind in (_ATOM, _GLOBAL):
            raise self.bad(f"items or state given to a {_KIND[parent.kind]}")
        if parent.frozen and kids:
            raise FormatError(f"{self.where}: the pickle changes a {_KIND[parent.kind]} after putting it into "
                              "another object (a recursive structure); refused before unpickling")
        leaves = 0
        for k in kids:
            if k.kind == _ATOM:  # a leaf: size 1, never filled
                leaves += 1
                continue
            k.frozen = True
            parent.size += k.size
            if k.depth + 1 > parent.depth:
                parent.depth = k.depth + 1
            if k.size > parent.kid:
                parent.kid = k.size
            if k.kid > parent.kid2:
                parent.kid2 = k.kid
            if k.kid2 > parent.kid3:
                parent.kid3 = k.kid2
        if leaves:
            parent.size += leaves
            parent.depth = max(parent.depth, 1)
            parent.kid = max(parent.kid, 1)
        if parent.size > self.cap:
            raise budget.exceeded(self.where, "pickle_expanded", f"an object of over {self.cap:,} nodes, its "
                                  "re-used (memoised) parts counted where used")
        if parent.depth > MAX_DEPTH:
            raise FormatError(f"{self.where}: the pickle nests objects deeper than {MAX_DEPTH} levels; refused "
                              "before unpickling")
        return parent

    def key(self, k: _Node, what: str) -> None:
        """``k`` is hashed (a dict key or set element): small and not a mutable container."""
        if k.kind in (_LIST, _DICT, _SET):
            raise FormatError(f"{self.where}: the pickle uses a {_KIND[k.kind]} as {what}; refused before unpickling")
        if k.size > MAX_KEY:
            raise FormatError(f"{self.where}: the pickle uses a {_KIND[k.kind]} of {k.size:,} nodes (shared parts "
                              f"counted where used) as {what}; keys of more than {MAX_KEY} are refused before "
                              "unpickling (hashing them is unbounded work)")

    def call(self, fn: _Node, args: list[_Node]) -> _Node:
        """A call (``REDUCE``, ``NEWOBJ``, ``OBJ``, ``INST``): an object as large as what it is given; a
        hashing constructor's elements (``set(x)``: ``x``'s items; ``dict(x)``: ``x``'s pairs' items) as keys."""
        name = (fn.text or "").rpartition(".")[2]
        if fn.kind == _GLOBAL and name in HASHING:
            for a in args:
                lim = a.kid2 if name in ("dict", "OrderedDict", "Counter", "defaultdict") else a.kid
                if lim > MAX_KEY:
                    raise FormatError(f"{self.where}: the pickle calls {fn.text} on items of {lim:,} nodes (shared "
                                      f"parts counted where used), which it would hash; keys of more than {MAX_KEY} "
                                      "are refused before unpickling")
        return self.add(_Node(_OBJ), [fn, *args])

    # -- the walk --------------------------------------------------------------------------------------------
    def run(self) -> int:
        buf, end, stack, memo, fixed, atom = self.buf, self.end, self.stack, self.memo, _FIXED, _ATOM_NODE
        while True:
            pos = self.pos
            if pos >= end:
                raise self.bad("the data ends before the STOP opcode")
            code = buf[pos]
            n = fixed.get(code)
            if n is not None:  # the frequent numbers and constants: one shared leaf, nothing else to know
                if pos + 1 + n > end:
                    raise self.bad(f"an argument of {n} bytes past the end of the data")
                self.pos = pos + 1 + n
                stack.append(atom)
                self.made += 1
                continue
            if code == 0x8C:  # SHORT_BINUNICODE: a leaf keeping its bytes (a STACK_GLOBAL may name it)
                if pos + 2 > end or pos + 2 + buf[pos + 1] > end:
                    raise self.bad("a string past the end of the data")
                n = buf[pos + 1]
                stack.append(_Text(buf[pos + 2:pos + 2 + n]))
                self.pos = pos + 2 + n
                self.made += 1
                continue
            if code == 0x94 and len(stack) > (self.marks[-1] if self.marks else 0):  # MEMOIZE
                self.pos = pos + 1
                memo[len(memo)] = stack[-1]
                continue
            self.pos = pos + 1
            h = _HANDLERS.get(code)
            if h is None:
                raise self.bad(f"unknown opcode 0x{code:02x}")
            if h(self):
                if not self.stack:
                    raise self.bad("STOP with an empty stack")
                return self.pos


def _atom(s: _Scan) -> None:
    s.push(_ATOM_NODE)


def _fixed(n: int):
    def h(s: _Scan) -> None:
        s.skip(n)
        s.push(_ATOM_NODE)
    return h


def _counted(fmt: str, keep: bool = False):
    size = struct.calcsize(fmt)

    def h(s: _Scan) -> None:
        (n,) = struct.unpack(fmt, s.take(size))
        if keep and 0 <= n <= 256:
            s.push(_Text(s.take(n)))
        else:
            s.skip(n)
            s.push(_ATOM_NODE)
    return h


def _line_atom(s: _Scan) -> None:
    s.line()
    s.push(_ATOM_NODE)


def _container(kind: int):
    def h(s: _Scan) -> None:
        s.push(_Node(kind))
    return h


def _tuple_n(n: int):
    def h(s: _Scan) -> None:
        if len(s.stack) - s.fence() < n:
            raise s.bad("stack underflow")
        kids = s.stack[len(s.stack) - n:] if n else []
        if n:
            del s.stack[-n:]
        s.push(s.add(_Node(_TUPLE), kids))
    return h


def _tuple_mark(s: _Scan) -> None:
    s.push(s.add(_Node(_TUPLE), s.to_mark()))


def _list_mark(s: _Scan) -> None:
    s.push(s.add(_Node(_LIST), s.to_mark()))


def _dict_mark(s: _Scan) -> None:
    items = s.to_mark()
    if len(items) % 2:
        raise s.bad("an odd number of items for DICT")
    for k in items[0::2]:
        s.key(k, "a dict key")
    s.push(s.add(_Node(_DICT), items))


def _frozenset_mark(s: _Scan) -> None:
    items = s.to_mark()
    for k in items:
        s.key(k, "a set element")
    s.push(s.add(_Node(_FROZENSET), items))


def _target(s: _Scan, at: int) -> _Node:
    """The object below position ``at`` of the stack (what ``APPENDS``/``SETITEMS``/``ADDITEMS`` fill)."""
    if at > len(s.stack) or at <= s.fence() or at < 1:
        raise s.bad("stack underflow")
    return s.stack[at - 1]


def _append(s: _Scan) -> None:
    v = s.pop()
    s.add(s.peek(), [v])


def _appends(s: _Scan) -> None:
    items = s.to_mark()
    s.add(_target(s, len(s.stack)), items)


def _setitem(s: _Scan) -> None:
    v = s.pop()
    k = s.pop()
    s.key(k, "a dict key")
    s.add(s.peek(), [k, v])


def _setitems(s: _Scan) -> None:
    items = s.to_mark()
    t = _target(s, len(s.stack))
    if len(items) % 2:
        raise s.bad("an odd number of items for SETITEMS")
    for k in items[0::2]:
        s.key(k, "a dict key")
    s.add(t, items)


def _additems(s: _Scan) -> None:
    items = s.to_mark()
    t = _target(s, len(s.stack))
    for k in items:
        s.key(k, "a set element")
    s.add(t, items)


def _pop(s: _Scan) -> None:
    if s.marks and s.marks[-1] == len(s.stack):
        s.marks.pop()
    else:
        s.pop()


def _dup(s: _Scan) -> None:
    s.stack.append(s.peek())


def _mark(s: _Scan) -> None:
    s.marks.append(len(s.stack))


def _pop_mark(s: _Scan) -> None:
    s.to_mark()


def _get(s: _Scan, i: int) -> None:
    n = s.memo.get(i)
    if n is None:
        raise s.bad(f"memo entry {i} read before it was written")
    s.stack.append(n)


def _put(s: _Scan, i: int) -> None:
    if i < 0 or i > s.made:  # the C unpickler sizes its memo table by the largest index
        raise s.bad(f"memo index {i:,} with {s.made:,} objects made")
    s.memo[i] = s.peek()


def _global_text(s: _Scan) -> None:
    mod, name = s.line(), s.line()
    s.push(_Node(_GLOBAL, f"{mod.decode('latin1')}.{name.decode('latin1')}"))


def _stack_global(s: _Scan) -> None:
    name, mod = s.pop(), s.pop()
    s.push(_Node(_GLOBAL, f"{mod.text}.{name.text}"))


def _reduce(s: _Scan) -> None:
    args = s.pop()
    fn = s.pop()
    s.push(s.call(fn, [args]))


def _newobj(s: _Scan) -> None:
    args = s.pop()
    cls = s.pop()
    s.push(s.call(cls, [args]))


def _newobj_ex(s: _Scan) -> None:
    kw = s.pop()
    args = s.pop()
    cls = s.pop()
    s.push(s.call(cls, [args, kw]))


def _obj(s: _Scan) -> None:
    items = s.to_mark()
    if not items:
        raise s.bad("OBJ without a class")
    s.push(s.call(items[0], items[1:]))


def _inst(s: _Scan) -> None:
    mod, name = s.line(), s.line()
    items = s.to_mark()
    s.push(s.call(_Node(_GLOBAL, f"{mod.decode('latin1')}.{name.decode('latin1')}"), items))


def _build(s: _Scan) -> None:
    state = s.pop()
    s.add(s.peek(), [state])


def _persid(s: _Scan) -> None:
    s.line()
    s.push(_Node(_OBJ))


def _binpersid(s: _Scan) -> None:
    pid = s.pop()
    s.push(s.add(_Node(_OBJ), [pid]))


def _readonly(s: _Scan) -> None:
    s.peek()


def _ext(n: int):
    def h(s: _Scan) -> None:
        s.skip(n)
        s.push(_Node(_GLOBAL, "extension"))
    return h


def _memo_op(fmt: str | None, fn):
    size = struct.calcsize(fmt) if fmt else 0

    def h(s: _Scan) -> None:
        i = struct.unpack(fmt, s.take(size))[0] if fmt else s.index(s.line())
        fn(s, i)
    return h


def _memoize(s: _Scan) -> None:
    _put(s, len(s.memo))


def _stop(s: _Scan) -> bool:
    return True


def _noarg(n: int):
    def h(s: _Scan) -> None:
        s.skip(n)
    return h


#: the leaf every number and constant shares (never a container: :meth:`_Scan.add` refuses to fill it)
_ATOM_NODE = _Node(_ATOM)
#: opcodes that push a number or constant of a fixed-size argument: BININT, BININT1, BININT2, BINFLOAT, NONE,
#: NEWTRUE, NEWFALSE
_FIXED = {ord("J"): 4, ord("K"): 1, ord("M"): 2, ord("G"): 8, ord("N"): 0, 0x88: 0, 0x89: 0}

_HANDLERS: dict[int, Any] = {
    ord("I"): _line_atom, ord("J"): _fixed(4), ord("K"): _fixed(1), ord("M"): _fixed(2), ord("L"): _line_atom,
    0x8a: _counted("<B"), 0x8b: _counted("<i"),
    ord("S"): _line_atom, ord("T"): _counted("<i"), ord("U"): _counted("<B"),
    ord("B"): _counted("<I"), ord("C"): _counted("<B"), 0x8e: _counted("<Q"), 0x96: _counted("<Q"),
    0x97: _atom, 0x98: _readonly, ord("N"): _atom, 0x88: _atom, 0x89: _atom,
    ord("V"): _line_atom, 0x8c: _counted("<B", keep=True), ord("X"): _counted("<I", keep=True),
    0x8d: _counted("<Q", keep=True), ord("F"): _line_atom, ord("G"): _fixed(8),
    ord("]"): _container(_LIST), ord("a"): _append, ord("e"): _appends, ord("l"): _list_mark,
    ord(")"): _tuple_n(0), ord("t"): _tuple_mark, 0x85: _tuple_n(1), 0x86: _tuple_n(2), 0x87: _tuple_n(3),
    ord("}"): _container(_DICT), ord("d"): _dict_mark, ord("s"): _setitem, ord("u"): _setitems,
    0x8f: _container(_SET), 0x90: _additems, 0x91: _frozenset_mark,
    ord("0"): _pop, ord("2"): _dup, ord("("): _mark, ord("1"): _pop_mark,
    ord("g"): _memo_op(None, _get), ord("h"): _memo_op("<B", _get), ord("j"): _memo_op("<I", _get),
    ord("p"): _memo_op(None, _put), ord("q"): _memo_op("<B", _put), ord("r"): _memo_op("<I", _put),
    0x94: _memoize, 0x82: _ext(1), 0x83: _ext(2), 0x84: _ext(4),
    ord("c"): _global_text, 0x93: _stack_global, ord("R"): _reduce, ord("b"): _build, ord("i"): _inst,
    ord("o"): _obj, 0x81: _newobj, 0x92: _newobj_ex, 0x80: _noarg(1), ord("."): _stop, 0x95: _noarg(8),
    ord("P"): _persid, ord("Q"): _binpersid,
}


def scan(data: Any, where: object, start: int = 0) -> int:
    """Check the pickle that starts at byte ``start`` of ``data`` (``bytes``, ``bytearray``, ``memoryview`` or
    ``mmap``) and return the offset just after its ``STOP``.

    Raises:
        FormatError: a damaged stream, nesting deeper than :data:`MAX_DEPTH`, a recursive structure, a
        container or large key hashed (module docstring). BudgetError: an object of more expanded nodes than
        the ``pickle_expanded`` limit."""
    if isinstance(data, memoryview):
        data = bytes(data)
    try:
        return _Scan(data, start, len(data), where).run()
    except (FormatError, BudgetError):
        raise
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise FormatError(f"{where}: not a readable pickle ({type(exc).__name__}); refused before unpickling") \
            from None


# -- bounded messages --------------------------------------------------------------------------------------

def brief(obj: Any, width: int = 60) -> str:
    """A ``repr``-like text of an untrusted value, at most ``width`` characters, made by a walk of at most a few
    dozen steps: 3 levels, 4 items per container, strings and bytes cut to ``width``; objects other than
    builtin containers, strings and numbers show their type's name only (their ``__repr__`` is never called)."""
    steps = [48]

    def r(o: Any, level: int) -> str:
        steps[0] -= 1
        if steps[0] < 0:
            return "..."
        if o is None or isinstance(o, (bool, float, complex)):
            return repr(o)
        if isinstance(o, int):
            return repr(o) if -10 ** 30 < o < 10 ** 30 else f"<int of {o.bit_length()} bits>"
        if isinstance(o, (str, bytes, bytearray)):
            return repr(o[:width]) + ("..." if len(o) > width else "")
        if isinstance(o, (list, tuple, set, frozenset, dict)):
            open_, close = {list: "[]", tuple: "()", dict: "{}"}.get(
                next((t for t in (list, tuple, dict) if isinstance(o, t)), set), "{}")
            if level >= 3:
                return f"{open_}...{close}"
            parts = []
            it = iter(o.items()) if isinstance(o, dict) else iter(o)
            for i, x in enumerate(it):
                if i >= 4:
                    parts.append("...")
                    break
                parts.append(f"{r(x[0], level + 1)}: {r(x[1], level + 1)}" if isinstance(o, dict) else
                             r(x, level + 1))
            return open_ + ", ".join(parts) + ("," if isinstance(o, tuple) and len(parts) == 1 else "") + close
        if isinstance(o, type):
            return f"<class {getattr(o, 'cls_path', None) or o.__name__}>"
        return f"<{type(o).__name__}>"

    text = r(obj, 0)
    return text if len(text) <= width else text[:width - 3] + "..."
