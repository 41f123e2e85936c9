"""Any source to any target: every readable-and-writable format pair, plus two-hop chains.

Weights come from torch modules (gate-distinct). Each conversion runs with verification on, so the
target's own framework (torch, onnxruntime, tf_keras, Keras 3, TensorFlow) computes the result and is
compared with the source side; then the written file is read back and its tensors compared with the
original: bit-exact, or (single-bias formats) the bias within one float32 rounding.
"""

from __future__ import annotations

import itertools

import pytest

import rnnconvert
from rnnconvert.engine import registry
from rnnconvert.engine.matrix import compare_layers

from conftest import torch_rnn
from rnnconvert.errors import DependencyError, UnsupportedError

torch = pytest.importorskip("torch")

RW = [f.name for f in registry.FORMATS if f.can_read and f.can_write]
SPECS = {"lstm": ("LSTM", {}), "gru": ("GRU", {}), "rnn": ("RNN", {"bias": False})}


def _path(tmp, stem, fmt):
    f = registry.get(fmt)
    return tmp / (stem + (f.extensions[0] if f.extensions else ""))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One file per (format, spec), written by rnnconvert from a torch-made .pt (itself verified)."""
    tmp = tmp_path_factory.mktemp("src")
    out = {}
    for spec, (kind, kw) in SPECS.items():
        pt = tmp / f"{spec}.pt"
        torch.save({f"rnn.{k}": v for k, v in torch_rnn(kind, 3, 4, seed=len(spec), **kw).state_dict().items()}, pt)
        for fmt in RW:
            dst = pt if fmt == "pt" else _path(tmp, f"{spec}_{fmt}", fmt)
            if fmt != "pt":
                try:
                    rnnconvert.convert(pt, dst, to=fmt)
                except UnsupportedError:  # a format that holds some cells only (TFLite's fused LSTM op)
                    continue
                except DependencyError:  # its runtime's framework is an extra not installed here
                    continue
            out[fmt, spec] = dst
    return out


def _layer(path, fmt):
    (layer,) = rnnconvert.load(path, fmt).layers
    return layer


@pytest.mark.parametrize("src_fmt,dst_fmt", list(itertools.product(RW, RW)))
def test_pair(sources, tmp_path, src_fmt, dst_fmt):
    done = 0
    for spec in SPECS:
        if (src_fmt, spec) not in sources or (dst_fmt, spec) not in sources:
            continue  # refused by (or no framework for) one of the two: the sources fixture tried
        done += 1
        src = sources[src_fmt, spec]
        dst = _path(tmp_path, f"{spec}_out", dst_fmt)
        rep = rnnconvert.convert(src, dst, to=dst_fmt, src_format=src_fmt)
        assert rep.verification.ok
        got = compare_layers(_layer(src, src_fmt), _layer(dst, dst_fmt))
        assert got in ("E", "R"), (spec, got)
        if src_fmt in ("pt", "onnx", "safetensors", "npz", "cudnn_npz") and dst_fmt in ("pt", "onnx", "safetensors",
                                                                                          "npz", "cudnn_npz"):
            assert got == "E", f"{spec}: two-bias formats must round-trip bit-exactly"
    if not done:
        pytest.skip(f"no cell both {src_fmt} and {dst_fmt} hold (or a framework missing)")


CHAINS = [("pt", "keras_h5", "onnx"), ("keras_h5", "onnx", "pt"), ("onnx", "tf_checkpoint", "safetensors"),
          ("keras3", "pt", "tf2_checkpoint"), ("cudnn_npz", "keras3", "npz")]


@pytest.mark.parametrize("a,b,c", [ch for ch in CHAINS if set(ch) <= set(RW)])
def test_two_hops_equal_one(sources, tmp_path, a, b, c):
    for spec in SPECS:
        if any((f, spec) not in sources for f in (a, b, c)):
            continue
        src = sources[a, spec]
        mid, direct, hop = (_path(tmp_path, f"{spec}_{n}", f) for n, f in (("mid", b), ("direct", c), ("hop", c)))
        rnnconvert.convert(src, mid, to=b, src_format=a)
        rnnconvert.convert(mid, hop, to=c, src_format=b)
        rnnconvert.convert(src, direct, to=c, src_format=a)
        assert compare_layers(_layer(direct, c), _layer(hop, c)) in ("E", "R")
