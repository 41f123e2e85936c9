"""Whole Keras 2 models to Keras 3 (issue #17): read, build, set every weight, verify the whole model.

Source: a Keras 2 / tf.keras / tf_keras full-model HDF5 file (root ``@model_config`` + ``model_weights``;
tf_keras ``saving/legacy/hdf5_format.py``), read with h5py in the isolated child of
:mod:`rnnconvert.safety.guard` (:func:`read_full_model`). Weights-only files have no architecture: they keep
the recurrent-layers-only output of :mod:`.keras3` (the chaining, the other layers' classes and their
activations are simply not in such a file).

Target: the config translated by :mod:`.keras_config`, built by Keras 3 (``keras.saving.
deserialize_keras_object`` of a whitelisted config, ``safe_mode``: no code runs), then every layer's
weights set: recurrent layers from the canonical model (:mod:`.h5_write` gives the Keras layout,
CuDNN kernels already turned, a CuDNNLSTM's two biases summed: one float32 rounding), every other layer
as stored (``@weight_names`` order = tf_keras ``trainable_weights + non_trainable_weights`` =
Keras 3's ``layer.weights`` order for the whitelisted classes; shapes checked one by one), Keras-2
hard_sigmoid layers rescaled (:class:`.keras_config.Rescale`).

Verification (:func:`rnnconvert.whole.verify.keras_whole_check.verify_model`): tf_keras runs the source file as stored
(never ``load_model``, whose HDF5 loader deserializes any object in the config, issue #40: the config rebuilt by
:func:`rnnconvert.safety.keras_sanitize.model_config` is built by ``model_from_json`` and the file's weights loaded
by tf_keras' own weight loader, datasets only; a model with CuDNN layers is rebuilt with tf_keras' CPU equivalents
``LSTM`` / ``GRU(reset_after=True)``, whose weights that loader converts), Keras 3 runs the written ``.keras``
(:func:`.keras3.built_archive`: its config rebuilt the same way, weights by ``load_weights``), both on the same
inputs: every top-level layer's output and the model outputs are compared, relative to the reference's scale:
by the one rule of whole models (:func:`rnnconvert.verify.whole_rule.decide_whole`: ``TOL * max(1, max|y2|)``,
``TOL = 2e-5`` (issue #17), plus twice the source's own float32 spread, measured where the first term alone does not
decide; issue #39): an ill-conditioned layer (the Mycroft GRU: linear activation, outputs up
to 66) drifts by up to 5e-4 relative between two float32 evaluations, whichever framework runs them.
"""

from __future__ import annotations

import contextlib
import copy

import json
from pathlib import Path
from typing import Any

import numpy as np

from ...core.model import Cell, Checkpoint, RNNLayer
from ...errors import FormatError, UnsupportedError, WholeModelError
from ...safety import guard, keras_sanitize
from . import keras_config
from ...conventions import keras_names as naming
from ...conventions.full_model import FullModel  # noqa: F401 - the record every whole-model reader returns

#: relative tolerance of the whole-model comparison (issue #17): ``max|d| <= TOL * max(1, max|ref|)``
TOL = 2e-5
#: generated inputs: batch and steps for inputs whose time dimension is free
BATCH, STEPS = 3, 9


def _read_in(path: str) -> FullModel | None:
    import h5py

    from . import h5_access

    with h5py.File(path, "r") as f:
        h5_access.check_links(f)
        if "model_weights" not in f:
            return None
        cfg_s = h5_access.attr_str(f, "model_config")
        if not cfg_s:
            return None
        try:
            config = json.loads(cfg_s)
        except json.JSONDecodeError as exc:
            raise FormatError(f"{path}: model_config is not valid JSON ({exc})") from exc
        g = f["model_weights"]
        version = h5_access.attr_str(g, "keras_version") or h5_access.attr_str(f, "keras_version")
        if (version or "").startswith("3"):  # Keras 3's own legacy .h5: its config is Keras 3's already
            return None
        full = FullModel(path, config, version)
        for lname in h5_access.attr_list(g, "layer_names"):
            if lname not in g:
                raise FormatError(f"{path}: layer '{lname}' is listed in layer_names but has no group")
            grp = g[lname]
            full.weights[lname] = [(wn, h5_access.read_dataset(grp[wn], f"{path}: {lname}/{wn}"))
                                   for wn in h5_access.attr_list(grp, "weight_names")]
        return full


def read_full_model(ckpt: Checkpoint) -> FullModel | None:
    """The full model behind ``ckpt`` when it was read from a Keras 1/2 full-model HDF5 file, else ``None``
    (weights-only files, Keras 3's own legacy ``.h5``, other formats). Read in the isolated child
    (:func:`rnnconvert.safety.guard.isolated`).

    Raises:
        FormatError: a damaged file (the same checks as :mod:`.h5_read`).
    """
    path = ckpt.meta.get("path")
    if ckpt.format != "keras_h5" or not path or not Path(path).is_file():
        return None
    from ...speed import filerows

    key = filerows.identity(path)
    if key in _FULL:  # a conversion reads it for its writer, then for its check: one isolated read (issue #39)
        return copy.copy(_FULL[key])
    try:
        full = guard.isolated(_read_in, (str(path),), path, "HDF5")
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise FormatError(f"{path}: damaged HDF5 file ({exc})") from exc
    if full is not None:  # every value rebuilt from rnnconvert's whitelist (issue #40)
        full.config = keras_sanitize.model_config(full.config, path, unknown="stub")
    if len(_FULL) > 4:
        _FULL.clear()
    _FULL[key] = full
    return copy.copy(full)


#: :func:`read_full_model` per file identity (path, inode, size, modification time): a file rewritten in place
#: is read again
_FULL: dict[tuple, Any] = {}


# --------------------------------------------------------------------------------------------
# Building in Keras 3
# --------------------------------------------------------------------------------------------



class Unfiltered:
    """Keras 3 and tf_keras cut their own frames out of the tracebacks they raise; inside this block they
    keep them (restored after), so that :func:`failure` can find the layer being built or run."""

    def __init__(self, k=None, tf=None):
        self.k, self.tf, self.was = k, tf, (None, None)

    def __enter__(self) -> "Unfiltered":
        kw = self.k.config.is_traceback_filtering_enabled() if self.k is not None else None
        tw = self.tf.debugging.is_traceback_filtering_enabled() if self.tf is not None else None
        self.was = (kw, tw)
        if kw:
            self.k.config.disable_traceback_filtering()
        if tw:
            self.tf.debugging.disable_traceback_filtering()
        return self

    def __exit__(self, *exc) -> None:
        if self.was[0]:
            self.k.config.enable_traceback_filtering()
        if self.was[1]:
            self.tf.debugging.enable_traceback_filtering()


def culprit(exc: BaseException, base: type, container: tuple[type, ...] = ()) -> list[str]:
    """The names of the layers (instances of ``base``, not of ``container``: models) whose methods are on
    ``exc``'s traceback, innermost first: the layer being built or run when it was raised."""
    names: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the exception and what it was raised from
        seen.add(id(e))
        tb = e.__traceback__
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for fr in reversed(frames):
            obj = fr.f_locals.get("self")
            if isinstance(obj, base) and not isinstance(obj, container):
                name = getattr(obj, "name", None)
                if isinstance(name, str) and name not in names:
                    names.append(name)
        e = e.__cause__ or e.__context__
    return names


def failure(exc: BaseException, what: str, full: FullModel, tr: keras_config.Translation | None,
            names: list[str]) -> UnsupportedError:
    """The one-line refusal for an exception raised inside Keras 3 / tf_keras / TensorFlow while ``what``
    (e.g. "Keras 3 builds the translated model"): it names the layer being built or run (``names``, from
    :func:`culprit`, matched against the translation's layer paths), its source class, the error's first line
    and the way out."""
    import re

    first = (str(exc).strip().splitlines() or [""])[0].strip()
    first = re.sub(r"\s*\[Op:[^\]]*\].*$", "", re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", first))  # TF's op frame
    first = first[:240] + ("..." if len(first) > 240 else "")
    err = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    paths = list(tr.source_classes) if tr is not None else []
    where, layer, cls = "a layer it does not name", "", ""
    for n in names:
        hit = next((p for p in paths if p == n or p.rsplit(".", 1)[-1] == n or p.rsplit("/", 1)[-1] == n), None)
        if hit is not None:
            where, layer, cls = f"layer '{hit}' ({tr.source_classes[hit]})", hit, tr.source_classes[hit]
            break
    else:
        if names:
            where, layer = f"layer '{names[0]}'", names[0]
    head = f"{full.path}: {where} cannot be written as a whole Keras 3 model: {what} raised {err}; "
    return WholeModelError(head + keras_config.WAY_OUT, cli=head + keras_config.WAY_OUT_CLI, layer=layer,
                           layer_class=cls, reason=head[:-2])


def passes(exc: BaseException) -> bool:
    """Errors that keep their own meaning (ours, out of memory, an interrupted run) and are not refusals."""
    from ...errors import RNNConvertError

    return isinstance(exc, (RNNConvertError, MemoryError))


def translate(full: FullModel) -> keras_config.Translation:
    """:func:`.keras_config.translate` with Keras 3's accepted keywords."""

    try:
        return keras_config.translate(full.config, keras_config.keras3_keywords(keras_config.import_keras3()))
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:  # a malformed model_config
        raise FormatError(f"{full.path}: malformed model_config ({type(exc).__name__}: {str(exc)[:160]})") from exc


def _scaled(w: np.ndarray, cols: np.ndarray | None) -> np.ndarray:
    """``w`` with ``cols`` of its last axis (all when ``None``) scaled by 1.2: one float32 rounding each."""
    out = np.array(w, copy=True)
    sel = (Ellipsis,) if cols is None else (Ellipsis, cols)
    out[sel] = (out[sel].astype(np.float64) * keras_config.HARD_SIGMOID_SCALE).astype(w.dtype)
    return out


def rescale(weights: list[np.ndarray], rs: keras_config.Rescale | None, units: int | None) -> list[np.ndarray]:
    """Keras-layout weights of one layer (a Bidirectional: both directions' lists concatenated) with
    the Keras-2 hard_sigmoid rescale ``rs`` applied (see :class:`.keras_config.Rescale`)."""
    if rs is None:
        return weights
    if rs.all:
        return [_scaled(w, None) for w in weights]
    cols = np.concatenate([np.arange(g * units, (g + 1) * units) for g in rs.gates])
    return [_scaled(w, cols) for w in weights]


def _rnn_weights(layer: RNNLayer) -> list[np.ndarray]:
    from .h5_write import keras_weights

    return [w for p in layer.params[0] for w in keras_weights(layer, p, False)]


def _children(k, model) -> list:
    return [lay for lay in model.layers if not isinstance(lay, k.layers.InputLayer)]


def _source_weights(full: FullModel, top: str, sub: list[str]) -> list[np.ndarray]:
    """The stored weights of the layer at ``top`` / ``sub...`` (nested models: the names under the
    nested model's group whose first path component is the inner layer's name)."""
    ws = full.weights.get(top, [])
    for name in sub:
        ws = [(wn.split("/", 1)[1], a) for wn, a in ws if wn.split("/", 1)[0] == name and "/" in wn]
    return [a for _, a in ws]


def set_weights(k, model, full: FullModel, tr: keras_config.Translation, ckpt: Checkpoint) -> list[str]:
    """Set every weight of the Keras 3 ``model`` built from ``tr``; returns one line per layer that has weights.

    Raises:
        FormatError: a stored weight of another shape than Keras 3's, or a layer without its weights.
    """
    lines: list[str] = []
    done: set[int] = set()

    def visit(model, trail: list[str]):
        for lay in _children(k, model):
            if id(lay) in done:
                continue
            done.add(id(lay))
            path = ".".join(trail + [lay.name])
            if tr.classes.get(path) in ("Sequential", "Functional"):
                visit(lay, trail + [lay.name])
                continue
            want = lay.get_weights()
            if not want:
                continue
            rs = tr.rescale.get(path)
            cls = tr.classes.get(path, type(lay).__name__)
            if cls in keras_config.RECURRENT or cls == "Bidirectional":
                try:
                    layer = ckpt.layer(path)
                except KeyError:
                    raise FormatError(f"layer '{path}': the reader found no recurrent layer of that name") from None
                got = rescale(_rnn_weights(layer), rs, layer.hidden_size)
                how = "canonical weights"
            else:
                top, sub = (trail + [lay.name])[0], (trail + [lay.name])[1:]
                got = rescale(_source_weights(full, top, sub), rs, None)
                how = "stored weights"
            if len(got) != len(want) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(got, want)):
                raise FormatError(f"layer '{path}' ({tr.source_classes.get(path, cls)}): the file holds weights of "
                                  f"shapes {[tuple(a.shape) for a in got]}, Keras 3 expects "
                                  f"{[tuple(b.shape) for b in want]}")
            lay.set_weights([np.asarray(a, dtype=b.dtype) for a, b in zip(got, want)])
            mark = ("; hard_sigmoid: weights rescaled by 1.2, not bit-exact" if rs else "")
            lines.append(f"{path}: Keras 3 {cls} ({how}{mark})")

    visit(model, [])
    return lines


def build(full: FullModel, ckpt: Checkpoint):
    """``(model, translation, lines)``: the Keras 3 model of ``full``, every weight set.

    Raises:
        UnsupportedError: a layer Keras 3 cannot express (named, with the reason).
        FormatError: weights that do not fit the architecture.
    """

    k = keras_config.import_keras3()
    tr = translate(full)
    with Unfiltered(k, _tf_module()):
        try:
            model = k.saving.deserialize_keras_object(keras_sanitize.model_config(tr.config, full.path),
                                                      safe_mode=True)
        except Exception as exc:  # noqa: BLE001 - whatever Keras 3 / TensorFlow raise: a refusal naming the layer
            if passes(exc):
                raise
            raise failure(exc, "Keras 3 building the translated layer", full, tr,
                          culprit(exc, k.layers.Layer, (k.Model,))) from exc
        try:
            lines = set_weights(k, model, full, tr, ckpt)
        except Exception as exc:  # noqa: BLE001
            if passes(exc):
                raise
            raise failure(exc, "Keras 3 setting the layer's weights", full, tr,
                          culprit(exc, k.layers.Layer, (k.Model,))) from exc
    return model, tr, lines


def _tf_module():
    """TensorFlow when it is imported already (Keras 3's TensorFlow backend, tf_keras), else ``None``."""
    import sys

    return sys.modules.get("tensorflow")


def save_model(model, out: str, full: FullModel, tr: keras_config.Translation) -> None:
    """``model.save(out)``; an exception raised inside Keras 3 (a layer whose config it cannot serialize)
    is the refusal of :func:`failure`; an operating-system error (full disk, ...) stays one."""
    import sys

    from ...engine import commit

    k = sys.modules.get("keras")
    with Unfiltered(k, _tf_module()):
        try:
            model.save(out)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001
            if passes(exc) or commit.output_error(exc, Path(out)) is not None:  # the environment: exit 10
                raise
            raise failure(exc, "Keras 3 saving the translated model", full, tr,
                          culprit(exc, k.layers.Layer, (k.Model,))) from exc


def rescaled_layers(tr: keras_config.Translation) -> list[str]:
    """The dotted paths of the layers whose weights were rescaled (hard_sigmoid), sorted."""
    return sorted(tr.rescale)


# --------------------------------------------------------------------------------------------
# Whole-model verification
# --------------------------------------------------------------------------------------------

def _tf_keras_config(config: dict) -> dict:
    """The source config with CuDNN layers replaced by tf_keras' CPU equivalents (the weights are then
    converted by tf_keras' own legacy loader: ``hdf5_format._convert_rnn_weights``), and ``reset_after=False``
    written out for GRU configs of Keras 2.0/2.1, which predate the key (tf_keras' default is ``True``); a
    Keras 2.0/2.1 layer's integer ``dtype`` beside its ``batch_input_shape`` is the model input's (see
    :func:`.keras_config.translate`): given to an ``InputLayer`` (:func:`_input_dtype_first`), not to the layer."""
    import copy

    def fix(obj):
        if isinstance(obj, dict):
            if obj.get("class_name") == "Sequential":
                obj = copy.deepcopy(obj)
                _input_dtype_first(obj)
            out = {k: fix(v) for k, v in obj.items()}
            c = out.get("config")
            if out.get("class_name") != "InputLayer" and isinstance(c, dict) \
                    and c.get("dtype") in keras_config.INPUT_DTYPES and c.get("batch_input_shape") is not None:
                out["config"] = {k: v for k, v in c.items() if k != "dtype"}
            if out.get("class_name") in naming.CUDNN_TWIN and isinstance(out.get("config"), dict):
                gru = out["class_name"] == naming.CUDNN_CLASS[Cell.GRU]
                out["class_name"] = naming.CUDNN_TWIN[out["class_name"]]
                c = dict(out["config"])
                c.update(activation="tanh", recurrent_activation="sigmoid")
                if gru:
                    c["reset_after"] = True
                out["config"] = c
            elif out.get("class_name") == "GRU" and isinstance(out.get("config"), dict) \
                    and "reset_after" not in out["config"]:  # Keras 2.0/2.1: reset-before (LAYOUTS.md §3.4)
                out["config"] = {**out["config"], "reset_after": False}
            return out
        if isinstance(obj, list):
            return [fix(v) for v in obj]
        return obj
    return fix(config)


def _input_dtype_first(seq: dict) -> None:
    """A Keras 2.0/2.1 Sequential whose first layer carries an integer ``dtype`` with its
    ``batch_input_shape`` (the dtype of the model input; its weights are float): the same model for tf_keras,
    which would make that layer's weights integers, is an ``InputLayer`` of that dtype before the layer."""
    try:
        recs = keras_config.layer_records(seq)
    except UnsupportedError:
        return
    c = recs[0].get("config") if recs else None
    if not isinstance(c, dict) or recs[0].get("class_name") == "InputLayer" \
            or c.get("dtype") not in keras_config.INPUT_DTYPES or c.get("batch_input_shape") is None:
        return
    recs[0] = {**recs[0], "config": {k: v for k, v in c.items() if k != "dtype"}}
    recs.insert(0, {"class_name": "InputLayer", "config": {
        "batch_input_shape": c["batch_input_shape"], "dtype": c["dtype"], "name": f"{c.get('name', 'input')}_input"}})


def source_model(path: str, config: dict, weights: dict[str, list[tuple[str, np.ndarray]]] | None = None):
    """The source model as tf_keras runs it, weights loaded by tf_keras from the file as stored: ``config`` rebuilt
    by :func:`rnnconvert.safety.keras_sanitize.model_config` (``unknown='refuse'``), built by ``model_from_json``,
    then ``model.load_weights(path)`` (tf_keras' HDF5 weight loader reads datasets and their names only; the file
    is never handed to ``load_model``, issue #40).

    With ``weights`` (a tf.keras / tf_keras SavedModel folder, :func:`rnnconvert.formats.tf.savedmodel_keras.
    read_full_model`): the SavedModel is never loaded (``tf_keras.models.load_model`` would restore its traced
    functions, which may hold any TensorFlow op, file operations included); tf_keras rebuilds the model from
    ``config`` (``model_from_json``; only the classes the whole-model writers build, so no Lambda or custom code
    is deserialized) and each top-level layer is given its stored weights (``layer.set_weights``, in
    ``layer.weights`` order), as the HDF5 loader does.

    Raises:
        UnsupportedError: a layer class outside :data:`rnnconvert.whole.conventions.keras_graph.LAYERS` (SavedModels),
            a class, key or object outside the sanitizer's whitelist.
        FormatError: stored weights that do not fit the rebuilt layer (SavedModels); a bad config value."""
    import os

    from ...errors import require

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    tfk = require("tf_keras", "tf")
    fixed = _tf_keras_config(config)
    if weights is not None:
        _built_in_only(path, fixed)
    # never load_model (its HDF5 loader deserializes any object in the config, issue #40): the config rebuilt
    # from rnnconvert's whitelist, then tf_keras' own weight loader (datasets only, no config read)
    fixed = keras_sanitize.model_config(fixed, path)
    if weights is not None:
        return _rebuilt(tfk, path, fixed, weights)
    model = tfk.models.model_from_json(json.dumps(fixed))
    model.load_weights(path)
    return model


def _built_in_only(path: str, obj: Any) -> None:
    """Refuse a config holding a layer class the whole-model writers do not build (before tf_keras sees it)."""
    from ...conventions import full_model

    if isinstance(obj, dict):
        cls, conf = obj.get("class_name"), obj.get("config")
        if isinstance(cls, str) and isinstance(conf, dict) and "name" in conf:
            if cls not in full_model.LAYERS and cls not in naming.CONTAINERS:
                head = f"{path}: layer '{conf.get('name')}' ({cls}): not a built-in layer the whole-model writers build"
                raise WholeModelError(f"{head}; {full_model.WAY_OUT}", layer=str(conf.get("name")), layer_class=cls,
                                      reason=head)
        for v in obj.values():
            _built_in_only(path, v)
    elif isinstance(obj, list):
        for v in obj:
            _built_in_only(path, v)


def _rebuilt(tfk, path: str, config: dict, weights: dict[str, list[tuple[str, np.ndarray]]]):
    """The model of ``config`` built by tf_keras, each top-level layer given ``weights[layer.name]``."""
    _built_in_only(path, config)
    model = tfk.models.model_from_json(json.dumps(config))
    for lay in model.layers:
        want = lay.weights
        if not want:
            continue
        got = [a for _, a in weights.get(lay.name, [])]
        if len(got) != len(want) or any(tuple(a.shape) != tuple(w.shape) for a, w in zip(got, want)):
            raise FormatError(f"{path}: layer '{lay.name}' ({type(lay).__name__}): the SavedModel holds weights of "
                              f"shapes {[tuple(a.shape) for a in got]}, tf_keras builds "
                              f"{[tuple(w.shape) for w in want]}")
        lay.set_weights([np.asarray(a) for a in got])
    return model


def _input_specs(config: dict) -> dict[str, dict]:
    """Per model input name: ``{'embedding': input_dim or None, 'mask_zero', 'mask_value'}`` from the layer
    that consumes it first (Embedding / Masking), read from the source config."""
    recs = keras_config.layer_records(config)
    specs: dict[str, dict] = {}
    if config.get("class_name") == "Sequential":
        first = next((r for r in recs if r.get("class_name") != "InputLayer"), None)
        inp = next((r["config"]["name"] for r in recs if r.get("class_name") == "InputLayer"), None)
        cons = {inp or "input": first}
    else:
        cons = {}
        for r in recs:
            if r.get("class_name") in ("NotEqual", "Any"):  # Keras 3's mask ops (keras_graph.K3_MASK_OPS)
                continue
            for node in r.get("inbound_nodes") or []:
                if isinstance(node, dict):  # Keras 3: {'args': [__keras_tensor__ ...], 'kwargs'}
                    node = [((a.get("config") or {}).get("keras_history") or [None]) for a in node.get("args") or []
                            if isinstance(a, dict)]
                for i in node:
                    if isinstance(i, list) and i:
                        cons.setdefault(i[0], r)
    for name, r in cons.items():
        c = (r or {}).get("config") or {}
        cls = (r or {}).get("class_name")
        specs[name] = {"embedding": c.get("input_dim") if cls == "Embedding" else None,
                       "mask_zero": bool(c.get("mask_zero")) if cls == "Embedding" else False,
                       "mask_value": c.get("mask_value") if cls == "Masking" else None}
    return specs


def make_inputs(tfm, config: dict, seed: int, steps: int = STEPS, padding: str = "any") -> dict[str, np.ndarray]:
    """Valid generated inputs, one array per model input: integer ids in ``[1, input_dim)`` for an input that
    feeds an Embedding (with ``mask_zero``: padding 0 where :func:`padded_steps` says), standard normal floats
    otherwise (feeding a ``Masking`` layer: those steps set to its ``mask_value``); free dimensions ``steps``
    long; the same arrays for the same ``seed``. ``padding``: ``'any'`` (default) or ``'end'`` (a file written
    for padding at the end only, ONNX ``mask_layout='end'``)."""
    rng = np.random.default_rng(seed)
    specs = _input_specs(config)
    out = {}
    for t in tfm.inputs:
        name = t.name.split(":")[0]
        lname = t.node.layer.name if hasattr(t, "node") else name
        spec = specs.get(lname) or next(iter(specs.values()), {}) if len(tfm.inputs) == 1 else specs.get(lname, {})
        spec = spec or {}
        shape = [BATCH] + [steps if d is None else int(d) for d in t.shape[1:]]
        if spec.get("embedding"):
            x = rng.integers(1, max(2, int(spec["embedding"])), size=shape).astype(np.int32)
            if spec.get("mask_zero") and x.ndim >= 2:
                for b, ts in padded_steps(x.shape[0], x.shape[1], padding):
                    x[b, ts] = 0
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            mv = spec.get("mask_value")
            if mv is not None and x.ndim >= 3:
                for b, ts in padded_steps(x.shape[0], x.shape[1], padding):
                    x[b, ts] = mv
        out[lname] = x
    return out


def fully_masked_inputs(tfm, config: dict, seed: int, steps: int = STEPS,
                        padding: str = "any") -> dict[str, np.ndarray] | None:
    """The whole-model check's second, small batch (session 18): two rows, the first the generated row 0 of
    :func:`make_inputs` (same ``seed``, ``steps``) with EVERY step of every masked input masked (id 0 for an
    Embedding with ``mask_zero``, ``mask_value`` for a Masking layer; the other inputs, ``initial_state`` ones
    included, as generated), the second that row 0 as generated. ``None`` where no input carries a mask. A wholly
    masked row is padding at the end too (any ``padding``). :func:`make_inputs`' own rows are not touched, so every
    check of the main batch is what it was; a row no step of which is seen is the case where tf_keras'
    ``backend.rnn`` outputs zeros (and returns the initial state) and a masked mean divides 0 by 0 (NaN)."""
    del padding  # a wholly masked row is end padding too
    specs = _input_specs(config)
    xs = make_inputs(tfm, config, seed, steps)
    masked = False
    out = {}
    for t in tfm.inputs:
        lname = t.node.layer.name if hasattr(t, "node") else t.name.split(":")[0]
        spec = specs.get(lname) or next(iter(specs.values()), {}) if len(tfm.inputs) == 1 else specs.get(lname, {})
        spec = spec or {}
        x = xs[lname]
        row = x[:1].copy()
        if spec.get("embedding") and spec.get("mask_zero") and x.ndim >= 2:
            row[...] = 0
            masked = True
        elif not spec.get("embedding") and spec.get("mask_value") is not None and x.ndim >= 3:
            row[...] = spec["mask_value"]
            masked = True
        out[lname] = np.concatenate([row, x[:1]], axis=0)
    return out if masked else None


def padded_steps(batch: int, steps: int, padding: str = "any") -> list[tuple[int, list[int]]]:
    """The padded steps of the generated masked inputs (:func:`make_inputs`), ``[(row, [time steps])]``: the
    first row none, the second its last 3 steps (``pad_sequences(padding='post')``), the third its first 2
    (``pad_sequences``' default, front padding) and one inside (issue #41: the whole-model ONNX graph's masks are
    checked for any padding; not with ``padding='end'``). Rows or steps too few for a form: that form is left out
    (a row keeps an unmasked step)."""
    out = []
    if batch > 1 and steps > 3:
        out.append((1, list(range(steps - 3, steps))))
    if batch > 2 and steps > 4 and padding != "end":
        out.append((2, [0, 1, 2 + (steps - 2) // 2]))
    return out


def tf_keras_model(tfm, name: str):
    """A tf_keras model from ``tfm``'s inputs to the output of its top-level layer ``name``."""
    import tf_keras

    return tf_keras.Model(tfm.inputs, tfm.get_layer(name).output)



@contextlib.contextmanager
def guarded(what: str, full: FullModel, tr: keras_config.Translation | None, framework: str):
    """A block in which an exception raised inside ``framework`` ('keras': Keras 3, 'tf_keras') or TensorFlow
    becomes the refusal of :func:`failure`, naming the layer on its traceback."""
    import sys

    with Unfiltered(sys.modules.get("keras") if framework == "keras" else None, _tf_module()):
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            if passes(exc):
                raise
            fw = sys.modules.get(framework)
            names = culprit(exc, fw.layers.Layer, (fw.Model,)) if fw is not None else []
            raise failure(exc, what, full, tr if tr is not None else _quiet_translation(full), names) from exc


def _quiet_translation(full: FullModel) -> keras_config.Translation | None:
    try:
        return translate(full)
    except Exception:  # noqa: BLE001 - only for naming the layer in a refusal
        return None


