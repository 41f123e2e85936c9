"""The torch_export runtime: a written ``.pt2`` program (:mod:`rnnconvert.whole.formats.torch.pt2_write`) loaded by
``torch.export.load`` and run by torch (verification's target side, issues #30 and #39).

A ``.pt2`` is never read as a source; ``verify SRC DST.pt2`` loads a file the user names, through
:func:`rnnconvert.safety.pt2_archive.load` (the archive checked, and ``torch.export.load`` run with every unpickling
path that can run code closed). Two kinds of program, two checks, no tolerance of this module's own (issue #39, docs/cli.md
"Verdicts"):

* a whole Keras model: :func:`verify_whole`, the whole-model check
  (:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`: every model output against tf_keras running the
  source, judged by :func:`rnnconvert.verify.whole_rule.decide_whole`, its spreads measured on the source only);
* the recurrent layers alone (``--recurrent-only``, and every source without a whole model): a runtime of the
  per-layer engine (:mod:`rnnconvert.verify.engine`), as onnxruntime is for an ``.onnx`` of the recurrent layers.
  :func:`forward` runs the written program whole (the layer's input fed, every stacked layer and direction of it
  and their joins run by the program's own graph: the short-sequence comparison); :func:`step` runs one step from
  each of the engine's states with the program's own constants (its ``state_dict``, every buffer the program
  computes with) in the module the program was exported from (:func:`rnnconvert.whole.formats.torch.pt2_write.
  recurrent_module`, the same torch kernels: ``aten.mkldnn_rnn_layer`` for a native LSTM, the chunked ``scan``
  otherwise), since a program exported from zero states takes no initial state. The verdict is the per-layer
  rule's (:func:`rnnconvert.verify.verdict.decide`: the one-step bound, the measured sequence tolerance,
  ``inconclusive`` where it cannot decide); :func:`verify_whole` adds nothing for such a program.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np

from ...core.model import Cell, Checkpoint
from ...safety import pt2_archive
from ...engine.protocol import Runtime
from ...errors import FormatError, require

#: the last program loaded (``key``: its resolved path, mtime and size; ``ep``: the ExportedProgram; ``module``:
#: ``ep.module()``; ``inputs``: its ``rnnconvert_inputs.txt``; ``layers``: the per-layer modules of :func:`_layer`)
_CACHE: dict = {}


def _exported(path: str | Path) -> tuple:
    """``(torch, cache)`` of the program at ``path``, loaded once per file version (:data:`_CACHE`)."""
    torch = require("torch", "torch")
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    if _CACHE.get("key") != key:
        extra = {"rnnconvert_inputs.txt": ""}
        ep = pt2_archive.load(torch, path, extra)  # checked first; no unpickling path that runs code stays open
        _CACHE.clear()
        _CACHE.update(key=key, ep=ep, module=None, inputs=extra["rnnconvert_inputs.txt"] or "", layers={})
    return torch, _CACHE


def release() -> None:
    """Drop the program kept loaded (:data:`_CACHE`)."""
    _CACHE.clear()


def _load(path: str | Path):
    torch, c = _exported(path)
    if c["module"] is None:
        c["module"] = c["ep"].module()
    return torch, c["module"]


def recurrent_only(path: str | Path, ckpt: Checkpoint) -> bool:
    """Whether the program at ``path`` is one of the recurrent layers of ``ckpt`` alone (one input
    ``'<layer>__in'`` per layer, in layer order: the names :func:`rnnconvert.whole.formats.torch.pt2_write.write`
    stores in the file's ``rnnconvert_inputs.txt``), not a whole model. A conversion's own mark
    (``ckpt.meta["pt2_recurrent_only"]``, ``ckpt.meta["whole_program"]``) decides first."""
    if ckpt.meta.get("pt2_recurrent_only") is True:
        return True
    if ckpt.meta.get("whole_program"):
        return False
    _, c = _exported(path)
    line = next((ln for ln in c["inputs"].splitlines() if ln.startswith("program inputs: ")), "")
    names = re.findall(r"'([^']*)' \(", line)
    return names == [f"{layer.name}__in" for layer in ckpt.layers]


def whole_only(path: str | Path, ckpt: Checkpoint, load=None) -> bool:
    """The runtime's ``whole_only``: a program of a whole model (not :func:`recurrent_only`), judged by
    :func:`verify_whole` alone."""
    return not recurrent_only(path, ckpt)


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load=None) -> np.ndarray:
    """Layer ``name`` of a written program of the recurrent layers (one input and output per layer, in layer
    order; the other inputs fed zeros) on ``x`` ``(B, T, I)``: ``(B, T, dirs*H)`` float64, the program run whole
    (every stacked layer and direction, from zero states).

    Raises:
        FormatError: a whole-model program (its layers are not inputs of their own: :func:`verify_whole`)."""
    if not recurrent_only(path, ckpt):
        raise FormatError(f"{path}: a whole-model program has no input of layer '{name}' of its own")
    torch, prog = _load(path)
    names = [layer.name for layer in ckpt.layers]
    args = [torch.from_numpy(np.asarray(x, np.float32)) if n == name
            else torch.zeros(x.shape[0], x.shape[1], layer.input_size) for n, layer in zip(names, ckpt.layers)]
    with torch.no_grad():
        return prog(*args)[names.index(name)].numpy().astype(np.float64)


def _layer(path: str | Path, ckpt: Checkpoint, name: str):
    """``(torch, module)``: the recurrent module the program of layer ``name`` was exported from
    (:func:`rnnconvert.whole.formats.torch.pt2_write.recurrent_module`), holding the program's own constants (every buffer ``rnns.<name>.*`` of its
    ``state_dict``, loaded strictly: a constant the program lacks or has in another shape is refused), the semantics
    the writer wrote (a TF1 cell's run-time ``forget_bias`` folded into ``b_f``, as the engine hands it to the writer:
    :func:`rnnconvert.engine.stream.writer_view`).

    Raises:
        FormatError: the program holds no such layer, or its constants do not fit the layer."""
    torch, c = _exported(path)
    if name not in c["layers"]:
        from ..formats.torch import pt2_write

        if not recurrent_only(path, ckpt):
            raise FormatError(f"{path}: a whole-model program has no input of layer '{name}' of its own")
        prefix = pt2_write.state_prefix(name)
        own = {k[len(prefix):]: v for k, v in c["ep"].state_dict.items() if k.startswith(prefix)}
        layer = ckpt.layer(name)
        if layer.semantics.forget_bias:  # the pt2 container folds it into b_f (FormatSpec.forget_bias "fold"):
            layer = layer.with_semantics(forget_bias=0.0)  # the program computes no run-time forget bias
        _, m = pt2_write.recurrent_module(layer)
        try:
            m.load_state_dict(own, strict=True)
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or ["state_dict mismatch"])[0]
            raise FormatError(f"{path}: the program's constants of layer '{name}' do not fit it: {first}") from exc
        c["layers"][name] = m.eval()
    return torch, c["layers"][name]


def step(path: str | Path, ckpt: Checkpoint, name: str, k: int, x: np.ndarray, states: list, load=None) -> list:
    """One step of stacked layer ``k`` of layer ``name`` from each of ``N`` states, the program's constants in the
    module it was exported from (:func:`_layer`): ``x`` ``(N, I_k)``, ``states[d] = (h0 (N, out), c0 (N, H) or
    None)``; returns ``[(h1 (N, out), c1 (N, H) or None)]`` per direction, float64. The same torch kernels as the
    program's (``aten.mkldnn_rnn_layer`` where the program runs it, else the chunked ``scan`` of
    ``layer_scan``)."""
    torch, m = _layer(path, ckpt, name)
    f32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.float32))  # noqa: E731
    xt = f32(x)
    N = xt.shape[0]
    lstm = m.cell is Cell.LSTM
    out = []
    with torch.no_grad():
        if m.native:
            for d, (h0, c0) in enumerate(states):
                _, h1, c1 = m.native_direction(xt[:, None], None, k, d, False, f32(h0), f32(c0))
                out.append((h1.numpy().astype(np.float64), c1.numpy().astype(np.float64)))
            return out
        bias = getattr(m, f"l{k}_bfold")
        xin = torch.stack([xt @ m.p(k, d, "w_ih").t() + (bias[d] if m.p(k, d, "b_ih") is None
                                                           else m.p(k, d, "b_ih") + bias[d]) for d in range(m.D)])
        h0 = torch.stack([f32(s[0]) for s in states])
        c0 = torch.stack([f32(s[1]) if s[1] is not None else torch.zeros(N, m.H) for s in states])
        _, hT, cT = m.layer_scan(xin.unsqueeze(0).contiguous(), k, h0, c0, None, lstm)
    return [(hT[d].numpy().astype(np.float64), cT[d].numpy().astype(np.float64) if lstm else None)
            for d in range(m.D)]


def verify_whole(ckpt: Checkpoint, src_path: str | Path, dst_path: str | Path, inputs: dict | None = None,
                 seed: int = 0) -> list:
    """The whole-model check of a written ``.pt2`` of a whole Keras model (module docstring);
    :class:`rnnconvert.verify.checks.LayerCheck` entries. A program written with states (``ckpt.meta["pt2_states"]``,
    :func:`rnnconvert.whole.formats.torch.pt2_write.check`) is fed zero initial states, as the source model starts;
    its final states are not compared. ``[]`` for a program of the recurrent layers alone (:func:`recurrent_only`):
    the per-layer engine judges it (:func:`forward`, :func:`step`)."""
    from ..verify import keras_whole_check

    full = keras_whole_check.whole_of(ckpt)
    try:
        if full is None or recurrent_only(dst_path, ckpt):
            return []
        return _compare_program(ckpt, full, src_path, dst_path, inputs, seed)
    finally:
        release()  # the program is not kept loaded after its check


def _compare_program(ckpt: Checkpoint, full, src_path, dst_path, inputs, seed) -> list:
    """:func:`verify_whole` of a whole model's program."""
    from ..conventions import keras_graph
    from ...formats.keras import keras_whole
    from ..verify import keras_whole_check
    from ..formats.torch import pt2_write

    torch, prog = _load(dst_path)
    route = f"torch {torch.__version__} (torch.export program)"
    graph = keras_graph.build(full.config, full.weights, ckpt)
    carried = ckpt.meta.get("pt2_states")  # written with states: zero initial states, as the source starts

    def target(xs):
        args = [torch.from_numpy(np.asarray(xs[n]).astype(np.int32 if e is not None else np.float32))
                for n, _, _, e in graph.inputs]
        if carried is not None:
            args.append({k: torch.zeros(args[0].shape[0], h) for k, h in carried.items()})
        with torch.no_grad():
            return [o.numpy() for o in prog(*args)[:len(graph.outputs)]], {}

    steps = pt2_write.program_steps(graph)  # strided layers: the length the program was exported at
    return keras_whole_check.compare_whole(str(src_path), full, target, route, inputs=inputs, seed=seed,
                                           run64=lambda xs: pt2_write.run_float64(graph, xs),
                                           run32=lambda xs: pt2_write.run_float64(graph, xs, double=False),
                                           steps=steps or keras_whole.STEPS, graph=lambda: graph)


RUNTIME = Runtime("torch_export", engine="torch", forward=forward, step=step, verify_whole=verify_whole,
                  whole_only=whole_only, release=release)


def import_module(py_path: str | Path, name: str = "rnnconvert_emitted"):
    """The module source at ``py_path`` (written by :mod:`rnnconvert.whole.formats.torch.module_write`) imported in a fresh
    module namespace (``importlib`` from the path; not put in ``sys.modules``, no bytecode cache written). It runs the
    file: only files rnnconvert has just written."""
    import importlib.machinery
    import importlib.util
    import sys

    loader = importlib.machinery.SourceFileLoader(name, str(py_path))
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    was, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = was
    return mod


def load_module(py_path: str | Path, state_path: str | Path):
    """``Model()`` of the emitted source at ``py_path`` with the state dict at ``state_path`` loaded
    (``torch.load(weights_only=True)``, strict), in eval mode."""
    torch = require("torch", "torch")
    from ..formats.torch import module_write

    m = getattr(import_module(py_path), module_write.CLASS)()
    m.load_state_dict(torch.load(str(state_path), weights_only=True))
    return m.eval()


def verify_module(ckpt: Checkpoint, src_path: str | Path, py_path: str | Path, state_path: str | Path,
                  inputs: dict | None = None, seed: int = 0) -> list:
    """The check of an emitted ``nn.Module`` (``--emit-module``): the written source imported from its file
    (:func:`import_module`), the written state dict loaded, run by torch in eval mode against tf_keras running the
    source model (:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`: every model output, the one rule of
    whole models, as the ``.pt2`` check; the spreads from the source's graph rebuilt in float32 and float64). Checks are named
    ``module output <i>`` (and ``module outputs (count)``).

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs. DependencyError: no tf_keras or torch.
    """
    import dataclasses

    from ..conventions import keras_graph
    from ..verify import keras_whole_check

    torch = require("torch", "torch")
    full = keras_whole_check.whole_of(ckpt)
    graph = keras_graph.build(full.config, full.weights, ckpt)
    m32 = load_module(py_path, state_path)
    route = f"torch {torch.__version__} (emitted nn.Module)"

    def run(m, xs, ftype):
        args = [torch.from_numpy(np.asarray(xs[n]).astype(np.int32 if e is not None else ftype))
                for n, _, _, e in graph.inputs]
        with torch.no_grad():
            y = m(*args)
        y = y if isinstance(y, tuple) else (y,)
        if y and isinstance(y[-1], dict):  # written with states: zero initial states (None), final states dropped
            y = y[:-1]
        return [o.numpy() for o in y], {}

    from ..formats.torch import pt2_write

    # the spreads from the source's graph rebuilt (never from the written module: it cannot widen its own tolerance)
    checks = keras_whole_check.compare_whole(str(src_path), full, lambda xs: run(m32, xs, np.float32), route,
                                             inputs=inputs, seed=seed,
                                             run64=lambda xs: pt2_write.run_float64(graph, xs),
                                             run32=lambda xs: pt2_write.run_float64(graph, xs, double=False),
                                             graph=lambda: graph)
    return [dataclasses.replace(c, name=c.name.replace("model output", "module output", 1)) for c in checks]
