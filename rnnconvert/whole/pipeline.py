"""The steps of a conversion that only whole models take (issue #38; called by :func:`rnnconvert.engine.pipeline.convert`,
which names them by location and so imports this module only when they are asked for): ``--emit-module``, a whole Keras 1/2 model as readable
``torch.nn.Module`` source (:mod:`.formats.torch.module_write`) and its state dict, checked like DST and
verified by :func:`rnnconvert.whole.runtimes.torch_export.verify_module`.

The whole-model writers of ``.onnx`` and ``.pt2`` are reached through their containers' records (the engine
passes the source's whole model as the write option ``whole_model``: :func:`rnnconvert.api.convert`) and their
checks through the runtimes' ``verify_whole``; both name this package's functions by location
(:func:`rnnconvert.engine.protocol.located`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.model import Checkpoint
from ..engine import commit
from ..errors import DependencyError, FormatError, OutputExistsError
from ..verify.engine import LayerCheck, VerifyReport


def emit_paths(emit_module: str | os.PathLike, src: Path, dst: Path, force: bool) -> tuple[Path, Path]:
    """``(module path, state path)`` of ``emit_module`` (:func:`rnnconvert.api.convert`), checked like DST.

    Raises:
        OptionError: not a ``.py`` path, or its stem is not a module name. FormatError: no such folder. OutputExistsError: one of the two is SRC or
            DST, or exists (no force).
    """
    import keyword
    import re

    from ..errors import OptionError
    from .formats.torch import module_write

    py = Path(emit_module)
    if py.suffix != ".py":
        raise OptionError(f"{py}: --emit-module writes Python source; give a path ending in .py")
    if not py.stem.isidentifier() or keyword.iskeyword(py.stem):
        good = re.sub(r"\W", "_", py.stem, flags=re.ASCII).lstrip("0123456789") or "model"
        raise OptionError(f"{py}: '{py.stem}' is not a Python module name (`import {py.stem}` fails); give e.g. "
                          f"{py.with_name(good + '.py').name}")
    state = module_write.state_path(py)
    for p in (py, state):
        if p.resolve() in (src.resolve(), dst.resolve()):
            raise OutputExistsError(f"{p} is the source or the output file; choose another --emit-module path")
        commit.check_destination(p, force)
    if not py.parent.exists():
        raise FormatError(f"{py.parent}: output directory does not exist")
    return py, state


def emit(ckpt: Checkpoint, in_mod, src: Path, emit: tuple[Path, Path], write_opts: dict[str, Any] | None):
    """The emitted module of the source's whole model (:func:`rnnconvert.whole.formats.torch.module_write.emit`;
    the write option ``states``, CLI ``--states``, gives it the states input and output).

    Raises:
        UnsupportedError: a source without a Keras 1/2 full model; a layer the module does not build (by name);
            ``states`` with a Bidirectional or go_backwards layer.
    """
    from .conventions import keras_graph
    from ..errors import UnsupportedError
    from .formats.torch import module_write

    full = (write_opts or {}).get("whole_model")
    if full is None and in_mod.whole_model is not None:
        full = in_mod.whole_model(ckpt)
    if full is None or not hasattr(full, "config"):
        raise UnsupportedError(f"{src.name}: --emit-module writes a whole Keras 1/2 model as nn.Module source, and "
                               "this source holds none (a full-model HDF5 file with its model_config is needed)")
    graph = keras_graph.build(full.config, full.weights, ckpt)
    return full, keras_graph.from_config(module_write.emit, graph, src.name, emit[0].stem, emit[1].name,
                                         bool((write_opts or {}).get("states")))


def emit_write(emitted, emit: tuple[Path, Path], ckpt: Checkpoint, src: Path, rep, verify: str | None,
                verify_inputs: dict[str, Any] | None, seed: int, tmps: list[Path]) -> None:
    """Write the emitted module and its state dict to temporaries beside their paths, verify them (when
    ``verify``: :func:`rnnconvert.whole.runtimes.torch_export.verify_module`, checks added to ``rep.verification``),
    note how to load them; the temporaries are appended to ``tmps`` as they are made (committed after DST by
    :func:`rnnconvert.api.convert`, discarded otherwise)."""
    from .formats.torch import module_write
    from .runtimes import torch_export

    _, em = emitted
    for final, data in zip(emit, (em.source.encode("utf-8"), module_write.state_bytes(em.state))):
        tmps.append(commit.temp_beside(final))
        tmps[-1].write_bytes(data)
    if verify:
        names = {layer.name for layer in ckpt.layers}
        model_in = {k: v for k, v in (verify_inputs or {}).items() if k not in names} or None
        if rep.verification is None:
            rep.verification = VerifyReport(seed=seed)
        try:
            rep.verification.layers += torch_export.verify_module(ckpt, src, tmps[0], tmps[1], inputs=model_in,
                                                                  seed=seed)
        except DependencyError as exc:
            rep.verification.layers.append(LayerCheck(
                "module (whole)", 0.0, 0.0, 0.0, "tf_keras (whole model)", "torch (emitted nn.Module)",
                verdict="inconclusive", reason=f"emitted-module check not run: {exc}"))
    rep.modules.append(f"{emit[0].name}: from {emit[0].stem} import {module_write.CLASS}; m = {module_write.CLASS}(); "
                       f"m.load_state_dict(torch.load('{emit[1].name}', weights_only=True)); "
                       f"m({', '.join(em.inputs)})")
    rep.notes.append(f"module written: {emit[0].name} (readable nn.Module source, class {module_write.CLASS}) and its "
                     f"state dict {emit[1].name} ({len(em.state)} tensors)")


def graph_fed(ckpt: Checkpoint, inputs: dict[str, Any] | None, seed: int) -> tuple[dict, list[str]]:
    """The rows the per-layer check of each recurrent layer of a whole Keras model runs on besides its own batch
    (issue #39: the per-layer rule on the inputs the graph feeds each layer), and the report's notes saying so:
    ``({layer name: [FedRows]}, notes)`` (:class:`rnnconvert.verify.sample.FedRows`: float32 ``(B, L, input_size)``
    and a label), from :func:`rnnconvert.whole.verify.keras_whole_check.graph_fed` (the numpy evaluator of the
    source graph on the whole-model check's model inputs ``inputs`` or the generated ones of ``seed``), every call
    of the layer in the graph.

    Exact, masks included: Keras runs a masked step by keeping the state (and giving the previous output, or
    zeros) in both directions (``backend.rnn``: ``where(mask, new, old)`` per step, the mask reversed with the
    inputs for ``go_backwards`` and a Bidirectional's backward layer), so the states a masked row reaches at its
    unmasked steps are those of the layer run, unmasked, on those steps in order, whatever the padding (front,
    end, inside), and the backward direction starts at the row's last unmasked step, as the graph's does. Each
    row is given as those steps, at their full length (nothing cut, nothing completed); rows of equal length
    form one group (one array); a fully masked row (no step of the layer's arithmetic) is left out. The outputs
    at masked steps (a copy of the previous output, or zeros) are no computation of the layer's weights: the
    whole-model check compares them. ``({}, [])`` where the numpy evaluator does not cover the model or the
    source holds no whole Keras model (the per-layer check then runs on its own batch alone).

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    import numpy as np

    from ..verify.sample import FedRows
    from .verify import keras_whole_check

    full = keras_whole_check.whole_of(ckpt)
    if full is None:
        return {}, []
    # the layers named as the Keras config names them, read (a lazy source's too: as the whole-model check reads it)
    fed = keras_whole_check.graph_fed(full.renamed(ckpt.materialize()), full, inputs, seed)
    if not fed:
        return {}, []
    out, notes = {}, []
    where = "given" if inputs else f"generated (seed {seed})"
    for name, calls in fed.items():
        groups: list = []
        for c, (x, mask) in enumerate(calls):
            keep = np.ones(x.shape[:2], bool) if mask is None else np.asarray(mask, bool)
            by_len: dict = {}
            for b in range(x.shape[0]):
                if keep[b].any():
                    by_len.setdefault(int(keep[b].sum()), []).append(b)
            call = f"call {c + 1}'s " if len(calls) > 1 else ""
            for n, rows in sorted(by_len.items(), reverse=True):
                xs = np.stack([x[b][keep[b]] for b in rows])
                label = (f"{call}graph-fed row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}"
                         f" ({n} step{'s' if n > 1 else ''})")
                groups.append(FedRows(label, np.ascontiguousarray(xs, dtype=np.float32), tuple(rows), c))
            masked = int((~keep).sum())
            rows_n = sum(len(r) for r in by_len.values())
            notes.append(
                f"{name}: checked per layer on its own batch plus the {rows_n} rows the model's graph feeds "
                f"{'its call ' + str(c + 1) if len(calls) > 1 else 'it'} on the whole-model check's {where} model "
                f"inputs (all {x.shape[1]} steps)"
                + (f"; its {masked} masked steps of {keep.size} as Keras runs them (the state kept: each row's "
                   f"unmasked steps in order, at their own length)" if masked else "")
                + (f"; {x.shape[0] - rows_n} fully masked rows left out" if rows_n < x.shape[0] else ""))
        if groups:
            out[name] = groups
    return out, notes
