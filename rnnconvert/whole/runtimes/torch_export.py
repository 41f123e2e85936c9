"""The torch_export runtime: a written ``.pt2`` program (:mod:`rnnconvert.whole.formats.torch.pt2_write`) loaded by
``torch.export.load`` and run by torch (verification's target side, issue #30).

Only files rnnconvert has just written are loaded (``torch.export.load`` unpickles; a ``.pt2`` is never read
as a source). :func:`verify_whole` is the whole check of such a file: a whole Keras model against tf_keras
running the source (:func:`rnnconvert.whole.verify.keras_whole_check.compare_whole`: every model output by the one rule of whole
models, the spreads also from the source's graph rebuilt and run eagerly in float32 and float64), or, for a program of the recurrent layers alone,
each layer's output against the canonical float64 equations :func:`rnnconvert.core.reference.forward`
(the rule ``max|d| <= TOL * max(1, max|ref|)`` with the float32 run of the same equations' spread added).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.model import Checkpoint
from ...engine.protocol import Runtime
from ...errors import require


def _load(path: str | Path):
    import io

    torch = require("torch", "torch")
    with open(path, "rb") as fh:  # a buffer: the temporary name does not end in .pt2 (torch warns otherwise)
        return torch, torch.export.load(io.BytesIO(fh.read())).module()


def forward(path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray, load=None) -> np.ndarray:
    """Layer ``name`` of a written program of the recurrent layers (one input and output per layer, in layer
    order; the other inputs fed zeros) on ``x`` ``(B, T, I)``: ``(B, T, dirs*H)`` float64.

    Raises:
        FormatError: a whole-model program (its layers are not inputs of their own: :func:`verify_whole`)."""
    from ...errors import FormatError

    torch, prog = _load(path)
    names = [layer.name for layer in ckpt.layers]
    if ckpt.meta.get("pt2_recurrent_only") is not True and ckpt.format == "keras_h5":
        raise FormatError(f"{path}: a whole-model program has no input of layer '{name}' of its own")
    args = [torch.from_numpy(np.asarray(x, np.float32)) if n == name
            else torch.zeros(x.shape[0], x.shape[1], layer.input_size) for n, layer in zip(names, ckpt.layers)]
    with torch.no_grad():
        return prog(*args)[names.index(name)].numpy().astype(np.float64)


def verify_whole(ckpt: Checkpoint, src_path: str | Path, dst_path: str | Path, inputs: dict | None = None,
                 seed: int = 0) -> list:
    """The checks of a written ``.pt2`` (module docstring); :class:`rnnconvert.verify.checks.LayerCheck` entries. A
    program written with states (``ckpt.meta["pt2_states"]``, :func:`rnnconvert.whole.formats.torch.pt2_write.check`)
    is fed zero initial states, as the source model starts; its final states are not compared."""
    from ..conventions import keras_graph
    from ...core import reference
    from ...formats.keras import keras_whole
    from ..verify import keras_whole_check
    from ..formats.torch import pt2_write
    from ...verify.checks import LayerCheck

    torch, prog = _load(dst_path)
    route = f"torch {torch.__version__} (torch.export program)"
    full = keras_whole_check.whole_of(ckpt)
    if full is not None and not ckpt.meta.get("pt2_recurrent_only"):
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
                                         steps=steps or keras_whole.STEPS)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((3, 9, layer.input_size)).astype(np.float32) for layer in ckpt.layers]
    with torch.no_grad():
        outs = prog(*[torch.from_numpy(x) for x in xs])
    checks = []
    for layer, x, y in zip(ckpt.layers, xs, outs):
        ref = reference.forward(layer, x)
        y32 = reference.forward(layer, x, np.float32).astype(np.float64)
        got = y.numpy().astype(np.float64)
        scale = float(np.max(np.abs(ref), initial=0.0))
        err = float(np.max(np.abs(got - ref), initial=0.0))
        tol = keras_whole.TOL * max(1.0, scale) + 2 * float(np.max(np.abs(y32 - ref), initial=0.0))
        checks.append(LayerCheck(layer.name, err, tol, scale, "numpy reference (float64)", route, "sequence",
                                 verdict="ok" if err <= tol else "fail",
                                 reason="" if err <= tol else f"differs by {err:.3g} (tolerance {tol:.3g})"))
    return checks


RUNTIME = Runtime("torch_export", engine="torch", forward=forward, verify_whole=verify_whole)


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
                                             run32=lambda xs: pt2_write.run_float64(graph, xs, double=False))
    return [dataclasses.replace(c, name=c.name.replace("model output", "module output", 1)) for c in checks]
