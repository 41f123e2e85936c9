"""Generators of the third attack corpus's budget families (issue 40: HIGH 4, HIGH 5 and the msgpack/pdparams
LOW items), one function per case; each writes a small file into the path it is given and returns it, made of
plain bytes (no payload is ever unpickled or run here). Nothing is committed as data:
``tests/security/test_attack_corpus3_budgets.py`` regenerates every case under a temporary folder, and
``python bench/fuzz/attack_corpus3_budgets.py OUTDIR`` writes them all for a manual run.

Families: pickle DAGs (memoised tuples 64 levels deep used as a dict key, in ``.pkl``, ``.pdparams``, a zip
``.pt``'s ``data.pkl`` and a legacy ``.pt``; the same DAG of lists reaching an error message that formats it; a
smaller DAG key that stays under the size limit); ``.pdparams`` with data after ``STOP``; TFLite vectors whose
entries alias one table (1,000 subgraph entries -> one subgraph, 100,000 operator entries -> one operator) and
distinct operators sharing one index vector; msgpack name collisions (``a.b`` beside ``a: {b}``, ``a/b``) and
a map holding one key twice.
"""

from __future__ import annotations

import pickle
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


# -- pickle ---------------------------------------------------------------------------------------------------

def _get(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)  # LONG_BINGET


def _put(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)  # LONG_BINPUT


def tuple_dag(levels: int) -> bytes:
    """Opcodes leaving on the stack only ``t_levels`` where ``t_0 = ()`` and ``t_i = (t_{i-1}, t_{i-1})`` (memo
    ``0..levels``): ``2**(levels+1) - 1`` nodes from ``12 * levels`` bytes."""
    out = bytearray(b")" + _put(0) + b"0")
    for i in range(1, levels + 1):
        out += _get(i - 1) + _get(i - 1) + b"\x86" + _put(i) + b"0"  # TUPLE2, POP
    return bytes(out + _get(levels))


def list_dag(levels: int) -> bytes:
    """The same DAG built of lists (``EMPTY_LIST``, ``MARK``, two ``GET``, ``APPENDS``)."""
    out = bytearray(b"]" + _put(0) + b"0")
    for i in range(1, levels + 1):
        out += b"]" + _put(i) + b"(" + _get(i - 1) + _get(i - 1) + b"e0"
    return bytes(out + _get(levels))


def dag_key_pickle(levels: int = 64) -> bytes:
    """``{t_levels: 1}``: the C unpickler would hash ``2**levels`` leaves in one call."""
    return b"\x80\x02}" + tuple_dag(levels) + b"K\x01s."


def dag_dtype_pickle(levels: int = 64) -> bytes:
    """``{'w': numpy.dtype(L_levels, False, True)}`` with ``L`` the list DAG: the dtype stand-in's error message
    formats its argument."""
    return (b"\x80\x02}X\x01\x00\x00\x00wcnumpy\ndtype\n" + list_dag(levels) + b"\x89\x88\x87R" + b"s.")


def pkl_dag_key(path: Path, levels: int = 64) -> Path:
    path.write_bytes(dag_key_pickle(levels))
    return path


def pkl_dag_message(path: Path, levels: int = 64) -> Path:
    path.write_bytes(dag_dtype_pickle(levels))
    return path


def pdparams_dag_key(path: Path, levels: int = 64) -> Path:
    path.write_bytes(dag_key_pickle(levels))
    return path


def pdparams_dag_message(path: Path, levels: int = 64) -> Path:
    path.write_bytes(dag_dtype_pickle(levels))
    return path


def pdparams_trailing(path: Path) -> Path:
    """A real ``paddle.save`` fixture with bytes after its ``STOP`` (a second pickle)."""
    path.write_bytes((ROOT / "fixtures" / "paddle" / "gru.pdparams").read_bytes() + pickle.dumps({"x": 1}))
    return path


def pt_zip_dag_key(path: Path, levels: int = 64) -> Path:
    """A ``torch.save``-style zip whose ``data.pkl`` is the DAG-key pickle."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", dag_key_pickle(levels))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    return path


def pt_legacy_dag_key(path: Path, levels: int = 64) -> Path:
    """A legacy (non-zip) ``torch.save`` file: magic number, protocol, sys_info, then the DAG-key pickle."""
    head = (pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
            + pickle.dumps({"protocol_version": 1001, "little_endian": True,
                            "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2))
    path.write_bytes(head + dag_key_pickle(levels) + pickle.dumps([], protocol=2))
    return path


# -- TFLite ---------------------------------------------------------------------------------------------------

def _tflite(n_sg: int, n_ops: int, shared_inputs: int = 0, distinct_ops: bool = False) -> bytes:
    """A ``TFL3`` flatbuffer: ``n_sg`` subgraph entries pointing at one subgraph whose ``n_ops`` operator entries
    point at one operator (``distinct_ops``: ``n_ops`` operator tables, each naming one shared vector of
    ``shared_inputs`` input indices)."""
    import flatbuffers

    b = flatbuffers.Builder(1 << 20)
    n_in = max(shared_inputs, 1)
    b.StartVector(4, n_in, 4)
    for _ in range(n_in):
        b.PrependInt32(0)
    ins = b.EndVector()
    b.StartVector(4, 1, 4)
    b.PrependInt32(0)
    outs = b.EndVector()

    def operator() -> int:
        b.StartObject(3)  # Operator: opcode_index, inputs, outputs
        b.PrependUint32Slot(0, 0, 1)
        b.PrependUOffsetTRelativeSlot(1, ins, 0)
        b.PrependUOffsetTRelativeSlot(2, outs, 0)
        return b.EndObject()

    tables = [operator() for _ in range(n_ops)] if distinct_ops else [operator()] * n_ops
    b.StartVector(4, n_ops, 4)
    for t in reversed(tables):
        b.PrependUOffsetTRelative(t)
    opsv = b.EndVector()
    b.StartVector(4, 1, 4)
    b.PrependInt32(1)
    shape = b.EndVector()
    b.StartObject(3)  # Tensor: shape, type, buffer
    b.PrependUOffsetTRelativeSlot(0, shape, 0)
    b.PrependUint32Slot(2, 0, 1)
    tensor = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(tensor)
    tensors = b.EndVector()
    b.StartObject(5)  # SubGraph: tensors, inputs, outputs, operators, name
    b.PrependUOffsetTRelativeSlot(0, tensors, 0)
    b.PrependUOffsetTRelativeSlot(3, opsv, 0)
    sg = b.EndObject()
    b.StartVector(4, n_sg, 4)
    for _ in range(n_sg):
        b.PrependUOffsetTRelative(sg)
    sgs = b.EndVector()
    b.StartObject(4)  # OperatorCode: deprecated_builtin_code, custom_code, version, builtin_code
    b.PrependInt32Slot(3, 0, 1)  # ADD
    code = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(code)
    codes = b.EndVector()
    b.StartObject(1)  # Buffer (empty)
    buf = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(buf)
    bufs = b.EndVector()
    b.StartObject(5)  # Model: version, operator_codes, subgraphs, description, buffers
    b.PrependUint32Slot(0, 3, 0)
    b.PrependUOffsetTRelativeSlot(1, codes, 0)
    b.PrependUOffsetTRelativeSlot(2, sgs, 0)
    b.PrependUOffsetTRelativeSlot(4, bufs, 0)
    model = b.EndObject()
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())


def tflite_aliased(path: Path, n_sg: int = 1000, n_ops: int = 100_000) -> Path:
    """1,000 subgraph entries -> one subgraph, 100,000 operator entries -> one operator (0.4 MB, 10**8 records)."""
    path.write_bytes(_tflite(n_sg, n_ops))
    return path


def tflite_shared_inputs(path: Path, n_ops: int = 20_000, n_in: int = 50_000) -> Path:
    """20,000 distinct operators naming one vector of 50,000 input indices (10**9 indices to walk)."""
    path.write_bytes(_tflite(1, n_ops, shared_inputs=n_in, distinct_ops=True))
    return path


# -- msgpack (Flax) -------------------------------------------------------------------------------------------

def _flax_tree() -> dict:
    import msgpack

    raw = (ROOT / "fixtures" / "jax" / "linen.msgpack").read_bytes()
    return msgpack.unpackb(raw, strict_map_key=False, ext_hook=lambda c, p: msgpack.ExtType(c, p))


def _arr(v: float):
    import msgpack

    return msgpack.ExtType(1, msgpack.packb(((2,), "float32", np.full(2, v, np.float32).tobytes())))


def msgpack_dotted_collision(path: Path, slash: bool = False) -> Path:
    """The linen fixture plus ``head.w`` (or ``head/w``) beside ``head: {w}``: two tensors named ``head.w``."""
    import msgpack

    d = _flax_tree()
    d["params"]["head/w" if slash else "head.w"] = _arr(1.0)
    d["params"]["head"] = {"w": _arr(2.0)}
    path.write_bytes(msgpack.packb(d))
    return path


def msgpack_duplicate_key(path: Path) -> Path:
    """The linen fixture with a map that holds ``head`` twice (msgpack keeps the last)."""
    import msgpack

    d = _flax_tree()
    params = d.pop("params")
    body = msgpack.packb(params)  # a map header then pairs; add one pair and fix the count
    n = len(params)
    assert body[0] == 0x80 + n and n + 2 < 16
    extra = msgpack.packb("head") + msgpack.packb(_arr(1.0))
    inner = bytes([0x80 + n + 2]) + body[1:] + extra + extra
    path.write_bytes(bytes([0x81]) + msgpack.packb("params") + inner)
    return path


CASES = {
    "dag_key.pkl": pkl_dag_key, "dag_message.pkl": pkl_dag_message,
    "dag_key_small.pkl": lambda p: pkl_dag_key(p, 12), "dag_message_small.pkl": lambda p: pkl_dag_message(p, 20),
    "dag_key.pdparams": pdparams_dag_key, "dag_message.pdparams": pdparams_dag_message,
    "dag_message_small.pdparams": lambda p: pdparams_dag_message(p, 20), "trailing.pdparams": pdparams_trailing,
    "dag_key_zip.pt": pt_zip_dag_key, "dag_key_legacy.pt": pt_legacy_dag_key,
    "aliased.tflite": tflite_aliased, "shared_inputs.tflite": tflite_shared_inputs,
    "dotted.msgpack": msgpack_dotted_collision, "slash.msgpack": lambda p: msgpack_dotted_collision(p, True),
    "duplicate.msgpack": msgpack_duplicate_key,
}


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "attack_corpus3_budgets")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in CASES.items():
        make(out / name)
        print(out / name)
