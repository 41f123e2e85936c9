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


def graph_fed(ckpt: Checkpoint, inputs: dict[str, Any] | None, seed: int, steps: int) -> tuple[dict, list[str]]:
    """The rows the per-layer check of each recurrent layer of a whole Keras model runs on besides its own batch
    (issue #39: the per-layer rule on the inputs the graph feeds each layer), and the report's notes saying so:
    ``({layer name: float32 (B, T, input_size)}, notes)``, from
    :func:`rnnconvert.whole.verify.keras_whole_check.graph_fed` (the numpy evaluator of the source graph on the
    whole-model check's model inputs ``inputs`` or the generated ones of ``seed``). The per-layer engine takes no
    mask: a masked row gives its unmasked steps in order (the run Keras' masking makes of it: a masked step keeps
    the state), completed with zero steps to the row length. Each row is cut to its first ``steps`` (the per-layer
    batch's steps: :func:`rnnconvert.verify.sample.batches`), or completed with zero steps to them. ``({}, [])`` where the numpy evaluator does not cover
    the model or the source holds no whole Keras model (the per-layer check then runs on its own batch alone).

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    import numpy as np

    from .verify import keras_whole_check

    full = keras_whole_check.whole_of(ckpt)
    if full is None:
        return {}, []
    # the layers named as the Keras config names them, read (a lazy source's too: as the whole-model check reads it)
    fed = keras_whole_check.graph_fed(full.renamed(ckpt.materialize()), full, inputs, seed)
    if not fed:
        return {}, []
    out, notes = {}, []
    for name, (x, mask) in fed.items():
        how = ""
        if mask is not None and not mask.all():
            idx = np.argsort(~mask, axis=1, kind="stable")
            keep = np.arange(x.shape[1])[None, :] < mask.sum(1)[:, None]
            x = np.where(keep[..., None], np.take_along_axis(x, idx[..., None], 1), np.float32(0))
            how = (f"; its {int((~mask).sum())} masked steps of {mask.size} removed (each row's unmasked steps in "
                   f"order, completed with zero steps: the per-layer check takes no mask)")
        cut = x.shape[1] > steps
        x = np.pad(x[:, :steps], ((0, 0), (0, max(0, steps - x.shape[1])), (0, 0)))
        out[name] = np.ascontiguousarray(x, dtype=np.float32)
        size = (f"their first {steps} of {fed[name][0].shape[1]} steps" if cut else
                f"{fed[name][0].shape[1]} steps" + (f", completed with zero steps to {steps}"
                                                     if fed[name][0].shape[1] < steps else ""))
        notes.append(f"{name}: checked per layer on its own batch plus the {x.shape[0]} rows the model's graph feeds "
                     f"it on the whole-model check's {'given' if inputs else f'generated (seed {seed})'} model "
                     f"inputs ({size}){how}")
    return out, notes
