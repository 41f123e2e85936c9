"""PyTorch state dicts (``.pt``, ``.pth``): writer, basic reader, and the torch side of verification.

Keys follow ``torch.nn.LSTM/GRU/RNN`` (``torch/nn/modules/rnn.py``): for stacked layer ``k`` and
direction suffix ``''`` / ``'_reverse'``:

* ``<layer>.weight_ih_l{k}{sfx}`` ``(G*H, in_k)``, ``<layer>.weight_hh_l{k}{sfx}`` ``(G*H, H or P)``,
* ``<layer>.bias_ih_l{k}{sfx}``, ``<layer>.bias_hh_l{k}{sfx}`` ``(G*H,)`` (absent when ``bias=False``),
* ``<layer>.weight_hr_l{k}{sfx}`` ``(P, H)`` with ``proj_size``;

gates LSTM i, f, g, o; GRU r, z, n (the canonical order: a copy, bit-exact). Files are written as a
plain ``dict[str, Tensor]`` that ``torch.load(path, weights_only=True)`` reads and
``load_state_dict(strict=True)`` accepts into ``nn.LSTM(..., batch_first=True)`` of matching size.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...core import gates
from ...engine import refusal, stream
from ...errors import FormatError, require
from ...io import filerows
from ...core.model import Cell, Checkpoint, DirectionParams, RNNLayer, Semantics, is_placeholder, placeholder
from . import naming, pt_writer
from .naming import describe_module, module_args  # noqa: F401  (part of this module's API)

ZIP_MAGIC = b"PK\x03\x04"
ROUTE = "torch"
#: the distribution whose version verification reports for the target side
ENGINE = "torch"
_ACT = {Cell.LSTM: "tanh", Cell.GRU: "tanh", Cell.RNN_TANH: "tanh", Cell.RNN_RELU: "relu"}


def sniff(head: bytes, path: Path) -> bool:
    """A zip whose member names look like ``torch.save`` / ``torch.jit.save`` output (``<archive>/data.pkl``),
    or a legacy (non-zip) ``torch.save`` file, which starts with the pickled magic number
    ``0x1950a86a20f9469cfc6c`` (``torch/serialization.py`` ``MAGIC_NUMBER``)."""
    if head.startswith(LEGACY_MAGIC):
        return True
    if not head.startswith(ZIP_MAGIC):
        return False
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()[:64])
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError):  # damaged zip
        return False


def refusals(layer: RNNLayer) -> list[str]:
    """What torch.nn cannot express about ``layer`` (empty when it can): exactly what the cuDNN
    equations cannot (:func:`rnnconvert.core.cudnn.refusals`), which torch.nn computes on every device."""
    from ...core import cudnn

    return cudnn.refusals(layer)


def check(ckpt: Checkpoint, **_: Any) -> list[str]:
    """Refuse layers torch.nn cannot express; return notes for what needs care outside the module.

    Raises:
        UnsupportedError: one line naming the layer, every blocking feature, and the way out.
    """
    notes = []
    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "pt", f"PyTorch nn.{naming.MODULE[layer.cell]}")
        if layer.bidirectional and layer.semantics.merge_mode not in ("concat", None):
            notes.append(f"{layer.name}: Keras merge_mode='{layer.semantics.merge_mode}': nn.{naming.MODULE[layer.cell]} "
                         "returns both directions concatenated; apply the merge to its output")
    return notes


def state_dict(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The numpy state dict of ``ckpt`` (RNN layers in torch naming, then the carried tensors): what
    ``torch.nn`` runs for any canonical layer, so a run-time ``forget_bias`` (which torch.nn lacks) is folded
    into ``b_ih`` first (:func:`rnnconvert.core.transforms.fold_forget_bias`, one rounding), as the engine
    folds it before the ``.pt`` writer (``FormatSpec.forget_bias``); used by the runtimes, not the writer."""
    from ...core.transforms import fold_forget_bias

    out: dict[str, np.ndarray] = {}
    for i, layer in enumerate(ckpt.layers):
        for k in range(layer.num_layers):
            one = fold_forget_bias(layer.one_slab(k, ckpt.slab(i, k)))
            out.update(pt_writer.slab_items(layer, k, one.params[0]))
    for key, arr in ckpt.tensors.items():
        if key in out:
            raise FormatError(f"tensor name '{key}' is used twice")
        out[key] = arr
    return out


#: this writer takes one slab at a time (:mod:`rnnconvert.formats.torch.pt_writer`).
STREAM = True


def open_stream(ckpt: Checkpoint, path: str | Path, **opts: Any):
    """Start a slab-by-slab ``.pt`` (:class:`rnnconvert.formats.torch.pt_writer.PtStream`)."""
    return pt_writer.open_stream(ckpt, path, **opts)


def write(ckpt: Checkpoint, path: str | Path, **_: Any) -> list[str]:
    """Write ``ckpt`` as a ``torch.save`` dict of tensors, byte for byte what ``torch.save(state_dict,
    open(path, 'wb'))`` writes (root folder ``archive``), one slab at a time; returns one line per layer
    naming its module.

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    return stream.stream_write(open_stream(ckpt, path), ckpt)


def build_module(layer: RNNLayer, sd: dict[str, Any], *, assign: bool = False):
    """A ``torch.nn`` module for ``layer`` loaded (strict) from the tensors ``sd`` under ``<layer>.``.

    ``assign=True`` (verification): the module is built on the meta device and takes the tensors of
    ``sd`` themselves (``load_state_dict(assign=True)``: no random initialisation of GB-sized parameters,
    no copy); the tensors may then be read-only file mappings, so the module must not be trained.
    ``assign=False`` (default): a normal module with its own parameters, copied from ``sd``."""
    torch = require("torch", "torch")
    cls = getattr(torch.nn, naming.MODULE[layer.cell])
    mod = cls(**module_args(layer), device="meta") if assign else cls(**module_args(layer))
    prefix = layer.name + "."
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
    if naming.is_cell(layer):  # nn.LSTMCell keys load into the equivalent one-layer nn.LSTM
        sub = {k + naming.suffix(0, 0): v for k, v in sub.items()}
    first = next(iter(sub.values()))
    mod = mod.to(first.dtype)
    mod.load_state_dict(sub, strict=True, assign=assign)
    return mod.eval()


def modules(ckpt: Checkpoint) -> dict[str, Any]:
    """Ready ``torch.nn`` modules for every layer of ``ckpt``, by layer name (eval mode, batch_first).

    Assumes :func:`check` passed (:func:`rnnconvert.api.torch_modules` calls it).
    """
    torch = require("torch", "torch")
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state_dict(ckpt).items()}
    return {layer.name: build_module(layer, sd) for layer in ckpt.layers}


def load_state(path: str | Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True, map_location='cpu')``; never unpickles code.

    Zip-format files (every ``torch.save`` since 1.6) are loaded with ``mmap=True``: tensors map the
    file's pages instead of being copied into memory, so a layer that is never touched (verification of
    one layer of a multi-GB file) is never read. Legacy (non-zip) files are read whole.

    Raises:
        FormatError: the file cannot be loaded with ``weights_only=True`` (the reason is given).
    """
    torch = require("torch", "torch")
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == ZIP_MAGIC
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise FormatError(f"{path}: not loadable as a PyTorch file with weights_only=True: {load_failure(exc)}") from exc


def load_failure(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` found wrong, in one line, without torch's advice to reload
    with ``weights_only=False`` or to allow-list globals (which would run the file's code): the
    ``WeightsUnpickler error:`` reason when torch gives one (``torch/serialization.py``), else the
    exception's first line that does not give such advice, else its type."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    m = re.search(r"WeightsUnpickler error:\s*(.+)", text, re.S)
    if m:
        reason = next((ln.strip() for ln in m.group(1).splitlines() if ln.strip()), "")
        reason = re.split(r"\.\s+Please use|\s+Please use", reason)[0].rstrip(".")
        if reason:
            return f"{reason} (refused: rnnconvert never runs code from a file)"
    for line in text.splitlines():
        line = line.strip()
        if line and not re.search(r"weights_only|trust|safe_globals|arbitrary code|add_safe_globals", line, re.I):
            return line[:300]
    return type(exc).__name__


def _big(layer: RNNLayer) -> bool:
    """Whether verification builds ``layer``'s module on the meta device and takes the file's tensors as they
    are (:func:`build_module` ``assign=True``: no random initialisation and copy of GB-sized parameters,
    1.4 s per GB here); small layers get a normal module (the meta machinery costs a 0.3 s import, more than
    their whole check)."""
    return layer.params[0][0].w_ih.size + layer.params[0][0].w_hh.size > (1 << 22)


#: The written file's tensors as loaded (memory-mapped) by :func:`load_state`, for one layer at a time, keyed
#: by the file's identity and the layer (and the slab, for stacked layers): verification's sequence and
#: one-step runs of a one-slab layer read the same pages, mapped once (a new mapping per run faulted every
#: page in again); the next key unmaps it, so the mapped pages counted in the process's memory stay one
#: layer's, or one slab's of a stacked layer (a 3 GB 8-slab layer: 3.3 GB -> 0.4 GB). :func:`release` drops it.
_STATE: dict[tuple, dict] = {}


def _mapped(path: str | Path, layer: RNNLayer, k: int | None = None) -> dict[str, Any]:
    """The file's tensors for ``layer`` (and, for slab ``k`` of a stacked layer, that slab: each slab mapped
    afresh, so that the pages of a multi-GB stacked layer are not all held at once; a one-slab layer's
    sequence and step runs share one mapping)."""
    key = (*filerows.identity(path), layer.name, k if layer.num_layers > 1 else None)
    if key not in _STATE:
        _STATE.clear()
        _STATE[key] = load_state(path)
    return _STATE[key]


def release() -> None:
    """Drop the mapped tensors of the last written file verification ran (:func:`_mapped`)."""
    _STATE.clear()


@contextlib.contextmanager
def native_kernels(torch):
    """torch's own CPU recurrent kernels for verification runs (``torch.backends.mkldnn.enabled`` off while
    inside, restored after). With oneDNN on, every ``nn.LSTM``/``nn.GRU`` call on CPU reorders all its
    weights into a fresh oneDNN buffer: for a verification batch of a few states that copy is the whole
    cost (one 400 MB bidirectional LSTM(2048) layer, a short sequence and one step: 0.58 s and 197 000 page
    faults against 0.18 s and none, docs/performance.md session 7). Either is torch computing from the
    file's tensors; the one-step bound assumes only float32 arithmetic, which both use."""
    old = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = old


def run_module(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """Build the ``torch.nn`` module of ``layer`` from torch tensors ``sd`` and run it on ``x`` (torch's native
    CPU kernels, :func:`native_kernels`); float64 result."""
    torch = require("torch", "torch")
    mod = build_module(layer, sd, assign=_big(layer))
    dtype = next(mod.parameters()).dtype
    with torch.no_grad(), native_kernels(torch):
        y, _ = mod(torch.from_numpy(np.asarray(x)).to(dtype))
    return y.double().numpy()


def target_forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
    """Run layer ``name`` of the written file ``path`` in torch on ``x`` ``(B, T, I)``; float64 result."""
    layer = ckpt.layer(name)
    return run_module(layer, _mapped(path, layer), x)


def run_slab(layer: RNNLayer, k: int, get, x: np.ndarray) -> np.ndarray:
    """Run stacked layer ``k`` of ``layer`` alone, as a one-layer ``torch.nn`` module loaded from the
    tensors ``get(key)`` (torch tensors, ``key`` in the full layer's naming ``<layer>.weight_ih_l{k}...``),
    on its input ``x`` ``(B, T, I_k)``; float64 ``(B, T, dirs*H)``. Verification of one slab at a time.

    Raises:
        FormatError: a tensor of the slab is missing from the file."""
    return run_module(*slab_state(layer, k, get), x)


def run_step(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray, states: list, device: str = "cpu") -> list:
    """One step of every direction of the one-layer ``layer`` (a slab, :meth:`RNNLayer.one_slab`) in its
    ``torch.nn`` module loaded from ``sd``: ``x`` ``(N, I)`` is fed as ``N`` sequences of length 1, each
    direction starting from its own ``states[d] = (h0 (N, out), c0 (N, H) or None)`` (torch ``h0``/``c0``,
    ``(D, N, .)``). Returns ``[(h1, c1 or None)]`` per direction, float64. Verification's one-step check
    (torch's native CPU kernels, :func:`native_kernels`).
    ``device='cuda'``: the module runs on the GPU (cuDNN)."""
    torch = require("torch", "torch")
    mod = build_module(layer, sd, assign=_big(layer)).to(device)
    dt = next(mod.parameters()).dtype
    h0 = torch.from_numpy(np.stack([np.asarray(s[0]) for s in states])).to(device, dt).contiguous()
    with torch.no_grad(), native_kernels(torch):
        xt = torch.from_numpy(np.asarray(x)[:, None, :]).to(device, dt)
        if layer.cell is Cell.LSTM:
            c0 = torch.from_numpy(np.stack([np.asarray(s[1]) for s in states])).to(device, dt).contiguous()
            _, (hn, cn) = mod(xt, (h0, c0))
            return [(hn[d].double().cpu().numpy(), cn[d].double().cpu().numpy()) for d in range(len(states))]
        _, hn = mod(xt, h0)
        return [(hn[d].double().cpu().numpy(), None) for d in range(len(states))]


def run_both(layer: RNNLayer, sd: dict[str, Any], x: np.ndarray, xf: np.ndarray, states: list) -> tuple:
    """:func:`run_module` on ``x`` ``(B, T, I)`` and :func:`run_step` on ``xf`` ``(N, I)`` from ``states`` in one call
    of the one-layer ``layer``'s ``torch.nn`` module loaded from ``sd``: a packed batch
    (``torch.nn.utils.rnn.pack_padded_sequence``) of the ``B`` sequences of length ``T`` from zero states and
    the ``N`` sequences of length 1 from ``states`` (torch ``h0``/``c0`` per sequence; each direction, the
    reverse one too, takes one step from its own state). Each weight matrix is then read (and packed by
    torch's GEMM) once for the input products of both, not twice: the 3 GB benchmark's target side, 150 ->
    90 ms per bidirectional LSTM(2048) layer (docs/performance.md, session 8). Returns ``(y, steps)``: float64
    ``(B, T, dirs*out)``, and ``[(h1, c1 or None)]`` per direction as :func:`run_step`. torch's native CPU
    kernels (:func:`native_kernels`). The same results as the two calls, up to the order of GEMM sums."""
    torch = require("torch", "torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    mod = build_module(layer, sd, assign=_big(layer))
    dt = next(mod.parameters()).dtype
    x, xf = np.asarray(x), np.asarray(xf)
    (B, T, I), N, D = x.shape, xf.shape[0], len(states)
    with torch.no_grad(), native_kernels(torch):
        xp = torch.zeros((B + N, T, I), dtype=dt)
        xp[:B] = torch.from_numpy(x).to(dt)
        xp[B:, 0] = torch.from_numpy(xf).to(dt)
        h0 = torch.zeros((D, B + N, states[0][0].shape[1]), dtype=dt)
        h0[:, B:] = torch.from_numpy(np.stack([np.asarray(s[0]) for s in states])).to(dt)
        packed = pack_padded_sequence(xp, torch.tensor([T] * B + [1] * N), batch_first=True, enforce_sorted=False)
        if layer.cell is Cell.LSTM:
            c0 = torch.zeros((D, B + N, layer.hidden_size), dtype=dt)
            c0[:, B:] = torch.from_numpy(np.stack([np.asarray(s[1]) for s in states])).to(dt)
            out, (hn, cn) = mod(packed, (h0, c0))
        else:
            out, hn = mod(packed, h0)
            cn = None
        y, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
    return y[:B].double().numpy(), [(hn[d, B:].double().numpy(), None if cn is None else cn[d, B:].double().numpy())
                                    for d in range(D)]


def slab_state(layer: RNNLayer, k: int, get) -> tuple[RNNLayer, dict[str, Any]]:
    """Stacked layer ``k`` of ``layer`` as a one-layer layer and its ``torch.nn`` tensors, taken with
    ``get(key)`` (``key`` in the full layer's naming) and renamed to the one-layer module's.

    Raises:
        FormatError: a tensor of the slab is missing from the file."""
    one = layer.one_slab(k)
    sd = {}
    for (key, _, _), (new, _, _) in zip(pt_writer.slab_plan(layer, k), pt_writer.slab_plan(one, 0)):
        try:
            sd[new] = get(key)
        except KeyError:
            raise FormatError(f"the written file has no tensor '{key}'") from None
    return one, sd


def step_canonical(layer: RNNLayer, k: int, x: np.ndarray, states: list, device: str = "cpu") -> list:
    """:func:`run_step` of stacked layer ``k`` of ``layer`` from its canonical parameters (read back from a
    written file by rnnconvert's reader: npz, cuDNN buffers), in ``torch.nn``."""
    torch = require("torch", "torch")
    one = layer.one_slab(k)
    sd = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in state_dict(Checkpoint(layers=[one])).items()}
    return run_step(one, sd, x, states, device)


def target_step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list) -> list:
    """Verification's one-step check: stacked layer ``k`` of layer ``name`` of the written file, loaded by
    ``torch.load`` into a one-layer ``torch.nn`` module, one step from each of the given states
    (:func:`run_step`)."""
    layer = ckpt.layer(name)
    one, sd = slab_state(layer, k, _mapped(path, layer, k).__getitem__)
    return run_step(one, sd, x, states)


def target_forward_slab(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray) -> np.ndarray:
    """Stacked layer ``k`` of layer ``name`` of the written file alone, in torch (``torch.load`` with
    ``mmap=True``: only the slab's pages are read; they are unmapped when this returns)."""
    layer = ckpt.layer(name)
    return run_slab(layer, k, _mapped(path, layer, k).__getitem__, x)


def target_slab_check(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, xf: np.ndarray,
                      states: list) -> tuple:
    """:func:`target_forward_slab` on ``x`` and :func:`target_step` on ``xf`` from ``states`` of stacked layer ``k``
    of layer ``name`` of the written file, in one torch call (:func:`run_both`)."""
    layer = ckpt.layer(name)
    one, sd = slab_state(layer, k, _mapped(path, layer, k).__getitem__)
    return run_both(one, sd, x, xf, states)


class MappedSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a state dict whose arrays are views of a mapped file
    (:class:`rnnconvert.io.mapped.MappedFile`; the safetensors reader): slab ``(i, k)`` = the arrays named
    ``keys[i][k]`` put in canonical form (as :func:`group_state_dict` does); ``release`` gives back their
    pages, ``release_array`` one array's. Made by :func:`lazy_state_dict`."""

    def __init__(self, mapped, arrays: dict[str, np.ndarray], keys: list, layers: list[RNNLayer]) -> None:
        self.mapped, self.arrays, self.keys = mapped, arrays, keys
        self.shape = [(layer.cell, layer.cell.gates * layer.hidden_size) for layer in layers]

    def read(self, i: int, k: int) -> list[DirectionParams]:
        cell, gh = self.shape[i]
        return [_direction([None if n is None else self.arrays[n] for n in names], cell, gh)
                for names in self.keys[i][k]]

    def release(self, i: int, k: int) -> None:
        for names in self.keys[i][k]:
            for n in names:
                if n is not None:
                    self.mapped.release_array(self.arrays[n])

    def release_array(self, a: np.ndarray) -> None:
        self.mapped.release_array(a)


def lazy_state_dict(sd: dict[str, np.ndarray], mapped, where: str, fmt: str, nonlinearity: str) -> Checkpoint:
    """:func:`group_state_dict` of ``sd`` (arrays that are views of ``mapped``, a
    :class:`rnnconvert.io.mapped.MappedFile`) as a lazy checkpoint: placeholder parameters, read one slab at a
    time through :class:`MappedSlabs`; the other tensors (``ckpt.tensors``) stay the mapped views.

    Raises:
        FormatError: as :func:`group_state_dict`."""
    stub = {k: placeholder(v.shape, v.dtype) if v.dtype.kind in "fc" else v for k, v in sd.items()}
    ckpt, keys = _group(stub, where, fmt, nonlinearity)
    return replace(ckpt, tensors={k: sd[k] for k in ckpt.tensors}, source=MappedSlabs(mapped, sd, keys, ckpt.layers))


#: Keys under which training scripts commonly nest the state dict (checked in this order).
WRAPPERS = ("state_dict", "model_state_dict", "model_state", "model", "net", "network", "module", "weights")
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pickled torch magic number


def _flatten(obj: Any, where: object = "torch.load output") -> dict[str, np.ndarray]:
    """Tensors of nested dicts as numpy arrays, keys joined with ``.`` (non-tensor leaves dropped); each
    container walked once, within the ``pickle_nodes`` limit (:func:`rnnconvert.io.budget.leaves`)."""
    torch = require("torch", "torch")
    from ...io import budget

    found = budget.leaves(obj, lambda o: isinstance(o, torch.Tensor), where, "pickle")
    for k, v in found.items():  # stride 0 / overlapping strides: more elements than the storage holds
        try:
            stored = v.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse): no data
            stored = 0
        budget.check_expansion(where, v.numel() * v.element_size(), stored, f"tensor '{k}' of shape {tuple(v.shape)}")
    keys = {}
    for v in found.values():  # views of shared storages: each written out in full
        try:
            st = v.untyped_storage()
            keys[id(v)] = (st.data_ptr(), st.nbytes()) if st.nbytes() else (id(v), 0)
        except (RuntimeError, NotImplementedError):
            keys[id(v)] = (id(v), 0)
    budget.check_aliasing(where, [(keys[id(v)][0], v.numel() * v.element_size()) for v in found.values()],
                          dict(keys.values()))
    return {k: v.detach().cpu().numpy() for k, v in found.items()}


def unwrap(obj: Any) -> Any:
    """The state dict inside a training checkpoint: ``obj[w]`` for the first wrapper key ``w`` in
    :data:`WRAPPERS` that holds a dict, when ``obj`` itself has no recurrent keys at its top level."""
    if isinstance(obj, dict) and not any(isinstance(k, str) and naming.FIRST_KEY.match(k) for k in obj):
        for w in WRAPPERS:
            if isinstance(obj.get(w), dict):
                return unwrap(obj[w])
    return obj


def has_torch_names(sd: dict[str, Any]) -> bool:
    """Whether any key of ``sd`` is a ``torch.nn`` recurrent key (``*.weight_ih_l{k}`` or ``*.weight_ih``);
    readers send files without one to the foreign-name table (:mod:`rnnconvert.core.names`)."""
    return any(isinstance(k, str) and naming.FIRST_KEY.match(k) for k in sd)


def _foreign(sd: dict[str, Any], where: str, nonlinearity: str, map: Any, container: str | None = None) -> Checkpoint:
    from ...core import names

    ckpt = names.fallback(sd, where, "pt", {"map": map, "nonlinearity": nonlinearity})
    if container:
        ckpt.meta["container"] = container
    return ckpt


def strip_module_prefix(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop the ``module.`` prefix that ``DataParallel``/``DistributedDataParallel`` add to every key."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def group_state_dict(sd: dict[str, np.ndarray], where: str, fmt: str = "pt", nonlinearity: str = "tanh") -> Checkpoint:
    """Group a flat state dict of numpy arrays (PyTorch key names) into recurrent layers.

    Used by the ``.pt`` and ``.safetensors`` readers. ``nn.LSTM/GRU/RNN`` keys (``weight_ih_l{k}``,
    ``_reverse``, ``weight_hr``) and cell keys (``weight_ih`` without suffix, ``nn.LSTMCell`` etc.) are
    recognised; ``nonlinearity`` tells the activation of ``nn.RNN``/``nn.RNNCell`` (not stored).
    Gate orders: :data:`rnnconvert.core.gates.TABLE` ``("torch", cell)`` (a copy: bit-exact). Values of ``sd``
    may be :func:`~rnnconvert.core.model.placeholder` arrays (a lazy reader): they are kept as they are.

    Raises:
        FormatError: no recurrent keys, or inconsistent shapes.
    """
    return _group(sd, where, fmt, nonlinearity)[0]


def _direction(a: list, layer_cell: Cell, gh: int) -> DirectionParams:
    """Canonical params of one direction from its ``weight_ih, weight_hh, bias_ih, bias_hh, weight_hr``
    (``None`` for absent ones; missing biases are zeros). Placeholders pass through as they are."""
    conv = gates.convention("torch", layer_cell)
    canon = lambda m, f: m if is_placeholder(m) else f(m, conv, layer_cell)  # noqa: E731
    zeros = np.zeros(gh, dtype=a[0].dtype)
    return DirectionParams(
        canon(a[0], gates.to_canonical), canon(a[1], gates.to_canonical),
        zeros if a[2] is None else canon(a[2], gates.vec_to_canonical),
        zeros.copy() if a[3] is None else canon(a[3], gates.vec_to_canonical), a[4])


def _group(sd: dict[str, np.ndarray], where: str, fmt: str, nonlinearity: str):
    """:func:`group_state_dict`, plus the key names of every slab: ``keys[i][k][d]`` lists the five keys
    (``None`` when absent) that :func:`_direction` takes, for a lazy reader's loader."""
    groups: dict[str, set[tuple[int, bool]]] = {}
    cells: set[str] = set()
    for key in sd:
        m = naming.FIRST_KEY.match(key)
        if m:
            prefix = m.group("prefix") or ""
            if m.group("k") is None:
                cells.add(prefix)
            groups.setdefault(prefix, set()).add((int(m.group("k") or 0), bool(m.group("rev"))))
    if not groups:
        raise FormatError(f"{where}: no recurrent module (keys '*.weight_ih_l0' or '*.weight_ih') in this file")
    ckpt = Checkpoint(format=fmt, meta={"path": where})
    used: set[str] = set()
    keys: list = []
    for prefix, found in groups.items():
        pre = f"{prefix}." if prefix else ""
        is_cell = prefix in cells
        nl = 1 + max(k for k, _ in found)
        bidi = any(r for _, r in found)
        s0 = naming.suffix(0, 0, is_cell)
        w_hh0 = sd.get(naming.param_key(prefix, "weight_hh", 0, 0, is_cell))
        w_hr0 = sd.get(naming.param_key(prefix, "weight_hr", 0, 0, is_cell))
        if w_hh0 is None:
            raise FormatError(f"{where}: '{pre}weight_ih{s0}' has no matching weight_hh{s0}")
        H = w_hr0.shape[1] if w_hr0 is not None else w_hh0.shape[1]
        G = w_hh0.shape[0] // H if H else 0
        cell = {4: Cell.LSTM, 3: Cell.GRU, 1: Cell.RNN_RELU if nonlinearity == "relu" else Cell.RNN_TANH}.get(G)
        if cell is None or G * H != w_hh0.shape[0]:
            raise FormatError(f"{where}: '{pre}weight_hh{s0}' of shape {tuple(w_hh0.shape)} fits no LSTM/GRU/RNN")
        has_bias = naming.param_key(prefix, "bias_ih", 0, 0, is_cell) in sd
        params, lkeys = [], []
        for k in range(nl):
            row, rkeys = [], []
            for rev in ([False, True] if bidi else [False]):
                names = [naming.param_key(prefix, stem, k, rev, is_cell) for stem, _ in naming.PARAMS]
                a = [sd.get(n) for n in names]
                if a[0] is None or a[1] is None:
                    raise FormatError(f"{where}: missing {names[0]} or {names[1]}")
                used.update(n for n, v in zip(names, a) if v is not None)
                try:
                    row.append(_direction(a, cell, G * H))
                except ValueError as exc:  # a weight whose rows do not split into the gates
                    raise FormatError(f"{where}: '{names[0]}': {exc}") from exc
                rkeys.append([n if v is not None else None for n, v in zip(names, a)])
            params.append(row)
            lkeys.append(rkeys)
        cls = f"nn.{naming.MODULE[cell]}" + ("Cell" if is_cell else "")
        try:
            ckpt.layers.append(RNNLayer(
                name=prefix or "rnn", cell=cell, input_size=params[0][0].w_ih.shape[1], hidden_size=H,
                num_layers=nl, bidirectional=bidi, proj_size=0 if w_hr0 is None else w_hr0.shape[0],
                bias=has_bias, semantics=Semantics(activation=_ACT[cell]), params=params,
                source={"format": fmt, "class_name": cls}))
        except ValueError as exc:
            raise FormatError(f"{where}: {exc}") from exc
        keys.append(lkeys)
    for key, v in sd.items():
        if key not in used:
            ckpt.tensors[key] = v
    return ckpt, keys


#: The reader can return a lazy checkpoint (docs/performance.md "Streaming conversion").
LAZY = True


def read(path: str | Path, *, nonlinearity: str = "tanh", lazy: bool = False, map: Any = None,
         **_: Any) -> Checkpoint:
    """Read a PyTorch file: a state dict of ``nn.LSTM/GRU/RNN`` or ``nn.*Cell`` modules (any prefix), a
    training checkpoint wrapping one (:data:`WRAPPERS`, ``module.`` prefix stripped), a legacy
    (non-zip) ``torch.save`` file, or a TorchScript archive (tensors read by the restricted reader of
    :mod:`rnnconvert.formats.torch.torchscript`, no code run). CUDA storages are mapped to the CPU.

    ``torch.save`` zip files are read without torch by the allow-list unpickler of
    :mod:`rnnconvert.formats.torch.torch_zip` (tensors are views of a memory map of the file); what it
    declines (legacy files, bfloat16, other globals, ...) is loaded with ``torch.load(weights_only=True)``.
    ``lazy=True`` (zip files read by the restricted reader): the recurrent parameters are placeholders
    read one slab at a time from ``ckpt.source`` (:class:`ZipSlabs`), whose ``release`` drops a slab's mapped pages.

    ``nonlinearity`` (``'tanh'``/``'relu'``) tells an ``nn.RNN``'s activation, which the file does not store.

    A file without ``torch.nn`` recurrent keys, or read with a name ``map``, goes through the foreign-name
    table (:mod:`rnnconvert.core.names`, docs/foreign-names.md; read eagerly): user cells with their own
    parameter names, TorchScript archives of hand-written RNNs.

    Raises:
        FormatError: not loadable with ``weights_only=True``, no recurrent keys, or inconsistent shapes.
    """
    from ...core import names
    from . import torch_zip, torchscript

    p = Path(path)
    if torchscript.is_torchscript(p):
        sd = strip_module_prefix(torchscript.read_tensors(p))
        if map is not None or not has_torch_names(sd):
            return _foreign(sd, str(p), nonlinearity, map, "TorchScript")
        ckpt = names.add_rest(group_state_dict(sd, str(p), "pt", nonlinearity), str(p), "pt", nonlinearity)
        ckpt.meta["container"] = "TorchScript"
        return ckpt
    try:
        arch = torch_zip.Archive(p)
        found = strip_module_prefix(torch_zip.tensors(unwrap(arch.load()), p))
    except torch_zip.Declined:
        sd = strip_module_prefix(_flatten(unwrap(load_state(p)), p))
        if map is not None or not has_torch_names(sd):
            return _foreign(sd, str(p), nonlinearity, map)
        return names.add_rest(group_state_dict(sd, str(p), "pt", nonlinearity), str(p), "pt", nonlinearity)
    except FormatError as exc:
        raise type(exc)(str(exc) if str(p) in str(exc) else f"{p}: {exc}") from exc
    if map is not None or not has_torch_names(found):
        return _foreign({k: arch.array(t) for k, t in found.items()}, str(p), nonlinearity, map)
    # stand-ins of the right shape/dtype holding no memory (NaN placeholders for float tensors)
    stub = {k: placeholder(t.shape, t.dtype) if t.dtype.kind in "fc" else
            np.broadcast_to(np.zeros((), t.dtype), t.shape) for k, t in found.items()}
    ckpt, keys = _group(stub, str(p), "pt", nonlinearity)
    ckpt = replace(ckpt, tensors={k: arch.array(found[k]) for k in ckpt.tensors},
                   source=ZipSlabs(arch, found, keys, ckpt.layers))
    if names.candidates(ckpt.tensors):  # hand-written cells beside torch.nn modules: read eagerly
        return names.add_rest(ckpt.materialize(), str(p), "pt", nonlinearity)
    return ckpt if lazy else ckpt.materialize()


class ZipSlabs:
    """The :class:`~rnnconvert.core.model.SlabSource` of a lazily read ``torch.save`` zip: slab ``(i, k)``
    = the arrays named ``keys[i][k]`` (per direction, in :func:`_direction`'s order; ``None`` for a missing
    bias) mapped from the archive (:class:`.torch_zip.Archive`) and put in canonical form; ``release``
    gives back their mapped pages, ``release_array`` one array's."""

    def __init__(self, arch, found: dict[str, Any], keys: list, layers: list[RNNLayer]) -> None:
        self.arch, self.found, self.keys = arch, found, keys
        self.shape = [(layer.cell, layer.cell.gates * layer.hidden_size) for layer in layers]

    def read(self, i: int, k: int) -> list[DirectionParams]:
        cell, gh = self.shape[i]
        return [_direction([None if n is None else self.arch.array(self.found[n]) for n in names], cell, gh)
                for names in self.keys[i][k]]

    def release(self, i: int, k: int) -> None:
        self.arch.release([self.found[n] for names in self.keys[i][k] for n in names if n is not None])

    def release_array(self, a: np.ndarray) -> None:
        self.arch.release_array(a)
