"""Checks of :mod:`rnnconvert.core.cudnn` against real cuDNN, through PyTorch on a CUDA device.

Used by ``tests/formats/cudnn_buffers/test_cudnn.py`` (tests marked ``cuda``) and ``bench/gpu_check.py``. Nothing here runs
without ``torch.cuda.is_available()``; torch is imported inside the functions.

* :func:`torch_offsets`: the element offset of every entry of ``nn.LSTM/GRU/RNN._flat_weights`` after
  ``flatten_parameters()`` (which calls ``torch._cudnn_rnn_flatten_weight``, asking cuDNN for every
  region's address; LAYOUTS §11.6, §17.1), relative to the start of the shared buffer.
* :func:`expected_offsets`: the same entries' offsets according to :func:`rnnconvert.core.cudnn.layout`.
* :func:`forward_module`: cuDNN forward of ``nn.LSTM/GRU/RNN`` loaded with ``unpack(pack(layer))``.
* :func:`forward_buffer`: cuDNN forward of OUR packed buffer handed to ``torch._cudnn_rnn`` as its
  ``weight_buf`` (the weight list is carved out of that buffer by :func:`rnnconvert.core.cudnn.layout`), so the layout
  itself is what is run.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core import cudnn
from ..errors import require
from ..core.model import Cell, RNNLayer

#: cuDNN ``cudnnRNNMode_t`` values (``CUDNN_RNN_RELU=0, CUDNN_RNN_TANH=1, CUDNN_LSTM=2, CUDNN_GRU=3``).
MODE = {Cell.RNN_RELU: 0, Cell.RNN_TANH: 1, Cell.LSTM: 2, Cell.GRU: 3}


def cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device with cuDNN."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and torch.backends.cudnn.is_available())


def _module(spec: cudnn.Spec, dtype=None, device: str = "cuda"):
    """A ``torch.nn.LSTM/GRU/RNN`` of ``spec`` on ``device`` with UNINITIALISED parameters: built on the meta
    device and given empty storage there (``to_empty``), so that no random initialisation runs (on the CPU it
    was 15.5 s of a 42 s ``verify --device cuda`` of the 3 GB benchmark, issue #33); every caller either loads
    weights into it or only reads where cuDNN placed them."""
    torch = require("torch", "torch")
    cls = {Cell.LSTM: torch.nn.LSTM, Cell.GRU: torch.nn.GRU}.get(spec.cell, torch.nn.RNN)
    kw = {"num_layers": spec.num_layers, "bidirectional": spec.bidirectional, "batch_first": True}
    if spec.cell is Cell.LSTM and spec.proj_size:
        kw["proj_size"] = spec.proj_size
    if spec.cell in (Cell.RNN_TANH, Cell.RNN_RELU):
        kw["nonlinearity"] = "relu" if spec.cell is Cell.RNN_RELU else "tanh"
    m = cls(spec.input_size, spec.hidden_size, device="meta", dtype=dtype or torch.float32, **kw)
    return m.to_empty(device=device)


def _names(spec: cudnn.Spec) -> list[tuple[str, int, str, int]]:
    """``(torch name, pseudo-layer, kind, first linLayerID)`` of each flat weight, in torch's order."""
    G, out = Cell(spec.cell).gates, []
    for k in range(spec.num_layers):
        for d in range(spec.dirs):
            sfx, p = f"_l{k}{'_reverse' if d else ''}", k * spec.dirs + d
            out += [(f"weight_ih{sfx}", p, "matrix", 0), (f"weight_hh{sfx}", p, "matrix", G),
                    (f"bias_ih{sfx}", p, "bias", 0), (f"bias_hh{sfx}", p, "bias", G)]
            if spec.proj_size:
                out.append((f"weight_hr{sfx}", p, "matrix", cudnn.PROJECTION_ID))
    return out


def expected_offsets(spec: cudnn.Spec) -> dict[str, int]:
    """Element offset of each torch flat weight according to :func:`rnnconvert.core.cudnn.layout`."""
    regions = {(r.pseudo_layer, r.kind, r.linear_layer_id): r.offset for r in cudnn.layout(spec)}
    return {name: regions[(p, kind, lid)] for name, p, kind, lid in _names(spec)}


def torch_offsets(spec: cudnn.Spec, dtype=None) -> tuple[dict[str, int], int]:
    """Offsets (elements) cuDNN gave each flat weight of a fresh CUDA module, and the buffer's length."""
    torch = require("torch", "torch")
    m = _module(spec, dtype)
    m.flatten_parameters()
    ws = dict(zip(m._flat_weights_names, m._flat_weights))
    base = ws[m._flat_weights_names[0]].untyped_storage().data_ptr()
    es = ws[m._flat_weights_names[0]].element_size()
    storage_len = ws[m._flat_weights_names[0]].untyped_storage().nbytes() // es
    offs = {n: (w.data_ptr() - base) // es for n, w in ws.items()}
    del torch
    return offs, storage_len


def compare_offsets(spec: cudnn.Spec, dtype=None) -> list[str]:
    """Mismatches between cuDNN's region offsets and :func:`rnnconvert.core.cudnn.layout` (empty when they agree)."""
    got, n = torch_offsets(spec, dtype)
    want = expected_offsets(spec)
    bad = [f"{k}: cuDNN offset {got[k]}, layout() says {want[k]}" for k in want if got.get(k) != want[k]]
    if n != cudnn.param_count(spec):
        bad.append(f"buffer length: cuDNN {n}, layout() {cudnn.param_count(spec)}")
    return bad


def forward_module(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    """cuDNN forward (``torch.nn`` module on CUDA, TF32 off) of ``unpack(pack(layer))``; ``(B, T, out)``."""
    torch = require("torch", "torch")
    m = module_of(layer)
    with torch.no_grad():
        y = m(torch.from_numpy(np.ascontiguousarray(x)).to("cuda", getattr(torch, str(layer.dtype))))[0]
    return y.float().cpu().numpy()


def module_of(layer: RNNLayer):
    """A ``torch.nn.LSTM/GRU/RNN`` on CUDA (batch_first, TF32 off, ``flatten_parameters()`` done) holding
    ``unpack(pack(layer))``: the weights as cuDNN's buffer gives them back."""
    torch = require("torch", "torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec = cudnn.Spec.of(layer)
    back = cudnn.unpack(cudnn.pack(layer), spec)
    dt = getattr(torch, str(layer.dtype))
    m = _module(spec, dt)
    sd = {}
    for (name, p, kind, _lid) in _names(spec):
        k, d = divmod(p, spec.dirs)
        dp = back.params[k][d]
        field = {"weight_ih": dp.w_ih, "weight_hh": dp.w_hh, "bias_ih": dp.b_ih, "bias_hh": dp.b_hh,
                 "weight_hr": dp.w_hr}[name.split("_l")[0]]
        sd[name] = torch.from_numpy(np.ascontiguousarray(field))
    m.load_state_dict(sd, strict=True)
    m.flatten_parameters()
    return m


def forward_buffer(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    """cuDNN forward of ``pack(layer)`` given to ``torch._cudnn_rnn`` as ``weight_buf``; ``(B, T, out)``."""
    torch = require("torch", "torch")
    torch.backends.cudnn.allow_tf32 = False
    spec = cudnn.Spec.of(layer)
    dt = getattr(torch, str(layer.dtype))
    buf = torch.from_numpy(cudnn.pack(layer)).to("cuda")
    regions = {(r.pseudo_layer, r.kind, r.linear_layer_id): r for r in cudnn.layout(spec)}
    G, H = Cell(spec.cell).gates, spec.hidden_size
    weights = []
    for (_name, p, kind, lid) in _names(spec):
        r = regions[(p, kind, lid)]
        rows = r.shape[0] * (1 if lid == cudnn.PROJECTION_ID else G)
        shape = (rows, r.shape[1]) if kind == "matrix" else (G * H,)
        weights.append(buf[r.offset:r.offset + int(np.prod(shape))].view(shape))
    B = x.shape[0]
    out = spec.proj_size or H
    hx = torch.zeros(spec.num_layers * spec.dirs, B, out, device="cuda", dtype=dt)
    cx = torch.zeros(spec.num_layers * spec.dirs, B, H, device="cuda", dtype=dt) if spec.cell is Cell.LSTM else None
    xt = torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dt)
    with torch.no_grad():
        res = torch._cudnn_rnn(xt, weights, 5 if spec.proj_size else 4, buf, hx, cx, MODE[Cell(spec.cell)], H,
                               spec.proj_size, spec.num_layers, True, 0.0, False, spec.bidirectional, [], None)
    return res[0].float().cpu().numpy()


def versions() -> dict[str, str]:
    """GPU name, driver/CUDA and cuDNN versions as torch reports them."""
    torch = require("torch", "torch")
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version())}


def check_layout(spec: cudnn.Spec, dtype=None) -> None:
    """Compare :func:`rnnconvert.core.cudnn.layout` with the offsets cuDNN reports on this GPU.

    Raises:
        VerificationError: naming every region that moved and the cuDNN version, e.g.
            ``"cuDNN 90100 places weight_hh_l1 at 1184, layout() says 1200; ..."``.
    """
    from ..errors import VerificationError

    bad = _layout_mismatches(spec, str(dtype))
    if bad:
        raise VerificationError(f"cuDNN {versions()['cudnn']} buffer layout differs from rnnconvert's for {spec}: "
                                + "; ".join(bad) + ". Read such buffers through their canonical variables")


@functools.lru_cache(maxsize=64)
def _layout_mismatches(spec: cudnn.Spec, dtype_name: str) -> tuple[str, ...]:
    """:func:`compare_offsets` once per spec and dtype in a process (each asks cuDNN to lay out a fresh buffer:
    11.2 s of the 42 s ``verify --device cuda`` of the 3 GB benchmark when repeated for every layer, issue #33)."""
    torch = require("torch", "torch")
    dtype = None if dtype_name == "None" else getattr(torch, dtype_name.replace("torch.", ""))
    return tuple(compare_offsets(spec, dtype))
