"""The end-to-end check of a Keras 2 model written whole as Keras 3 (the keras3 runtime's ``verify_whole``,
:mod:`rnnconvert.runtimes.keras3`): the source model run by tf_keras (the file as stored) against Keras 3 loading
the written ``.keras``, every top-level layer with one call and every model output; the same check for a
written ONNX graph, ``.pt2`` program or emitted module (:func:`compare_whole`). A check that misses the first
stage is judged again against the source run in float64 by its own framework (:func:`second_stage`: ``ok``,
``inconclusive`` or FAIL; issue #39)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np

from ...formats.keras import keras_config, keras_whole
from ...errors import FormatError
from ...safety import keras_sanitize
from ...verify.checks import LayerCheck
from ...formats.keras.keras_whole import TOL, FullModel


def as_float64(obj: Any) -> Any:
    if isinstance(obj, dict):
        if obj.get("class_name") in ("DTypePolicy", "Policy") and (obj.get("config") or {}).get("name") == "float32":
            return "float64"
        return {k: ("float64" if k == "dtype" and v == "float32" else as_float64(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [as_float64(v) for v in obj]
    return obj


def float64_twin(k, model):
    """The written Keras 3 model rebuilt in float64 with its (float32) weights widened exactly, or ``None``
    when Keras cannot rebuild it: it measures how far two float32 evaluations may drift apart on this batch
    (``2 * max|y32 - y64|``), the second stage of the rule of :mod:`rnnconvert.verify.engine`."""
    try:
        cls = type(model).__name__ if type(model).__name__ in keras_sanitize.CONTAINERS else "Functional"
        cfg = keras_sanitize.model_config({"class_name": cls, "config": as_float64(model.get_config())},
                                          "the written model")["config"]  # the whitelist first (issue #40)
        twin = type(model).from_config(cfg)
        twin.set_weights([np.asarray(w, np.float64) for w in model.get_weights()])
        return twin
    except Exception as exc:  # noqa: BLE001 - whatever Keras 3 / TensorFlow raise: no second stage
        if keras_whole.passes(exc):
            raise
        return None


_KERNELS_LOCK = __import__("threading").Lock()


@contextlib.contextmanager
def standard_rnn_kernels():
    """tf_keras builds its ``LSTM``/``GRU`` layers with the standard (CPU) implementation only, while the block
    runs: ``gru_with_backend_selection``/``lstm_with_backend_selection`` trace the cuDNN and the standard function
    and register both for Grappler to pick one by device (10 of 16 s of a 29-layer model's ``load_model`` here);
    on a CPU Grappler picks ``standard_gru``/``standard_lstm``, the functions called here directly, with the same
    arguments and results. Nothing is patched where tf_keras is not installed."""
    try:
        from tf_keras.src.layers.rnn import gru, lstm
    except ImportError:
        yield
        return
    with _KERNELS_LOCK:
        saved = gru.gru_with_backend_selection, lstm.lstm_with_backend_selection
        gru.gru_with_backend_selection, lstm.lstm_with_backend_selection = gru.standard_gru, lstm.standard_lstm
        try:
            yield
        finally:
            gru.gru_with_backend_selection, lstm.lstm_with_backend_selection = saved


def keras3_source_model(path: str, config: dict | None = None):
    """The source ``.keras`` archive as Keras 3 runs it, on a private copy of the file: built from its config
    rebuilt from rnnconvert's whitelist, weights loaded by Keras 3 (:func:`rnnconvert.formats.keras.keras3.
    built_archive`; never ``load_model``, issue #40)."""
    import os
    import shutil
    import tempfile

    from ...formats.keras import keras3

    k = keras_config.import_keras3()
    with tempfile.TemporaryDirectory(prefix="rnnconvert-k3src-") as tmp:
        local = os.path.join(tmp, "source.keras")
        shutil.copyfile(path, local)
        return keras3.built_archive(k, local, config)


def whole_of(ckpt) -> FullModel | None:
    """The whole Keras model behind ``ckpt`` for the whole-model checks: a Keras 1/2 HDF5 file or a Keras 3
    archive (:func:`rnnconvert.whole.formats.keras.whole_source.whole_source`), a tf.keras / tf_keras SavedModel folder
    (:func:`rnnconvert.formats.tf.savedmodel_keras.read_full_model`); ``None`` otherwise."""
    if ckpt.format == "tf_checkpoint":
        from ...formats.tf import savedmodel_keras

        return savedmodel_keras.read_full_model(ckpt)
    if ckpt.format not in ("keras_h5", "keras3"):
        return None
    from ..formats.keras import whole_source

    return whole_source.whole_source(ckpt)


def source_framework(full: FullModel) -> tuple[str, str]:
    """``(route name, guarded framework)`` of the framework that runs ``full``'s source."""
    if full.framework == "keras3":
        return "keras 3 (whole model)", "keras"
    if full.origin == "weights":  # a SavedModel: rebuilt from its config, its functions never loaded
        return "tf_keras (whole model rebuilt from its config)", "tf_keras"
    return "tf_keras (whole model)", "tf_keras"


def _sub_model(full: FullModel, m, name: str):
    """The source model ``m`` cut at its top-level layer ``name`` (tf_keras or Keras 3)."""
    if full.framework == "keras3":
        k = keras_config.import_keras3()
        return k.Model(m.inputs, m.get_layer(name).output)
    return keras_whole.tf_keras_model(m, name)


def _source_and_inputs(src_path: str, full: FullModel, inputs: dict[str, np.ndarray] | None, seed: int,
                       steps: int = keras_whole.STEPS, padding: str = "any"):
    """The source model in tf_keras (the file as stored), its input names, and the inputs both sides run on:
    ``inputs`` (``--inputs``, which must name exactly the model's inputs) or generated valid ones.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    if full.framework == "keras3":  # a Keras 3 .keras archive: Keras 3 runs its source (issue #30)
        with keras_whole.guarded("Keras 3 loading the source model (the reference of the whole-model check)", full,
                                 None, "keras"):
            tfm = keras3_source_model(src_path, full.config)
    else:
        with keras_whole.guarded("tf_keras loading the source model (the reference of the whole-model check)", full,
                                 None, "tf_keras"):
            with standard_rnn_kernels():
                tfm = keras_whole.source_model(src_path, full.config,
                                               full.weights if full.origin == "weights" else None)
    names_in = [t.node.layer.name if hasattr(t, "node") else t.name.split(":")[0] for t in tfm.inputs]
    if inputs:
        missing = [n for n in names_in if n not in inputs]
        extra = [n for n in inputs if n not in names_in]
        if missing or extra:
            raise FormatError(f"whole-model verification inputs must name the model inputs "
                              f"{', '.join(names_in)}; missing {missing}, unknown {extra}")
        xs = {n: np.asarray(inputs[n]) for n in names_in}
    else:
        xs = keras_whole.make_inputs(tfm, full.config, seed, steps, padding)
    return tfm, names_in, xs


def verify_model(src_path: str, dst_path: str, full: FullModel, inputs: dict[str, np.ndarray] | None = None,
                 seed: int = 0) -> list:
    """Compare the source model (tf_keras, file as stored) with the written ``.keras`` (Keras 3
    ``load_model``): every top-level layer with one call and every model output.

    Args:
        inputs: ``{model input name: array}`` (``--inputs``), else generated (:func:`rnnconvert.formats.keras.keras_whole.make_inputs`).

    Returns:
        :class:`rnnconvert.verify.checks.LayerCheck` entries named ``model:<layer>`` and ``model output <i>``.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs. DependencyError: no tf_keras.
    """
    import os
    import shutil
    import tempfile
    import warnings

    from ...formats.keras import keras3

    k = keras_config.import_keras3()
    tfm, names_in, xs = _source_and_inputs(src_path, full, inputs, seed)
    with tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        local = os.path.join(tmp, "model.keras")
        shutil.copyfile(dst_path, local)
        with keras_whole.guarded("Keras 3 loading the written model", full, None, "keras"):
            new = keras3.built_archive(k, local)  # never load_model (issue #40)
    args = [xs[n] for n in names_in]
    single = [lay.name for lay in tfm.layers if len(getattr(lay, "_inbound_nodes", [])) == 1
              and type(lay).__name__ != "InputLayer" and not isinstance(lay.output, (list, tuple))]
    checks = []
    with keras_whole.guarded("tf_keras running the source model (the reference of the whole-model check)", full, None,
                             "tf_keras"):
        y2 = tfm(args if len(args) > 1 else args[0], training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras 3 warns about list-vs-name input structures
        with keras_whole.guarded("Keras 3 running the written model", full, None, "keras"):
            y3 = new(args, training=False)
    y2 = y2 if isinstance(y2, (list, tuple)) else [y2]
    y3 = y3 if isinstance(y3, (list, tuple)) else [y3]
    pairs = [(f"model output {i}", a, b) for i, (a, b) in enumerate(zip(y2, y3))]
    for n in single:  # one probe per layer: a layer Keras 3 cannot probe alone is still covered by the outputs
        try:
            a = keras_whole.tf_keras_model(tfm, n)(args if len(args) > 1 else args[0], training=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                b = k.Model(new.inputs, new.get_layer(n).output)(args, training=False)
        except (ValueError, AttributeError, KeyError, TypeError):
            continue
        pairs.append((f"model:{n}", a, b))
    for name, a, b in pairs:
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(k.ops.convert_to_numpy(b), dtype=np.float64)
        if a.shape != b.shape:
            checks.append(LayerCheck(name, float("inf"), 0.0, float(np.max(np.abs(a), initial=0.0)),
                                     "tf_keras (whole model)", "keras 3 load_model", "float32", verdict="fail",
                                     reason=f"shape {b.shape} where the source gives {a.shape}"))
            continue
        ref = float(np.max(np.abs(a), initial=0.0))
        err = float(np.max(np.abs(a - b), initial=0.0))
        tol = TOL * max(1.0, ref)
        checks.append(LayerCheck(name, err, tol, ref, "tf_keras (whole model)", "keras 3 load_model", "float32",
                                 verdict="ok" if err <= tol else "fail",
                                 reason="" if err <= tol else f"differs by {err:.3g} (tolerance {tol:.3g})"))
    failed = [i for i, c in enumerate(checks) if not c.ok and np.isfinite(c.max_abs_err)]
    twin = source_float64(full, tfm) if failed else None
    if twin is not None:  # stage 2: the source's own float64 run decides (:func:`second_stage`)
        keys = [int(checks[i].name.rsplit(" ", 1)[1]) if checks[i].name.startswith("model output")
                else checks[i].name.split(":", 1)[1] for i in failed]
        z64 = _twin_outputs(full, twin, keys, args)
        for i, key in zip(failed, keys):
            c, (_, a, b) = checks[i], pairs[i]
            checks[i] = second_stage(c, np.asarray(a, np.float64),
                                     np.asarray(k.ops.convert_to_numpy(b), np.float64), z64.get(key), [])
    if len(y2) != len(y3):
        checks.append(LayerCheck("model outputs (count)", float("inf"), 0.0, 0.0, "tf_keras (whole model)",
                                 "keras 3 load_model", "float32", verdict="fail",
                                 reason=f"{len(y3)} outputs where the source has {len(y2)}"))
    return checks


#: a whole-model check FAILs beyond ``TOL * max(1, scale) + FAIL_FACTOR * 2 * S`` (``S`` the largest measured
#: float32 spread); between the allowance and that the spreads cannot decide: ``inconclusive`` (issue #39)
FAIL_FACTOR = 16.0


def _max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))


def source_float64(full: FullModel, model):
    """The source model rebuilt in float64 by its own framework (tf_keras or Keras 3) from the built model's
    config, every weight widened exactly, or ``None`` when the framework cannot rebuild it: the exact-arithmetic
    reference of the second stage (:func:`second_stage`); it depends on SRC only, so a written file cannot
    widen its own tolerance."""
    import json

    try:
        if full.framework == "keras3":
            return float64_twin(keras_config.import_keras3(), model)
        import tf_keras as tfk

        cfg = keras_sanitize.model_config(as_float64(json.loads(model.to_json())), "the source model")
        with standard_rnn_kernels():  # the whitelist first (issue #40), as every build from a config
            twin = tfk.models.model_from_json(json.dumps(cfg))
        twin.set_weights([np.asarray(w, np.float64) for w in model.get_weights()])
        return twin
    except Exception as exc:  # noqa: BLE001 - whatever the framework raises: the rebuilt graph's float64 run instead
        if keras_whole.passes(exc):
            raise
        return None


def _twin_outputs(full: FullModel, twin, keys: list, args: list) -> dict:
    """``{key: float64 array}`` of the float64 twin on ``args`` (the float inputs widened): ``key`` a model output
    index or a top-level layer name; one run of the twin for every key (:func:`_source_run`); a key the twin cannot
    give is absent, and a twin that cannot run gives ``{}``."""
    args64 = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in args]
    names = [k for k in keys if not isinstance(k, int)]
    try:
        y, probed = _source_run(full, twin, args64 if len(args64) > 1 else args64[0], names)
    except Exception as exc:  # noqa: BLE001
        if keras_whole.passes(exc):
            raise
        return {}
    got = {k: y[k] for k in keys if isinstance(k, int) and k < len(y)}
    got.update({n: probed[n] for n in names if n in probed})
    return {k: np.asarray(v, np.float64) for k, v in got.items()}


def second_stage(c: LayerCheck, a32, b, z64, spreads: list[float]) -> LayerCheck:
    """Judge again a whole-model check that missed ``TOL * max(1, scale)`` against the source's float32 output
    ``a32`` (issue #39: one float32 sample of a long or ill-conditioned model's drift is not a bound).

    ``z64``: the source computed in float64 (:func:`source_float64`; else the rebuilt graph's float64 run), the
    exact function up to float64 rounding; ``spreads``: further measured float32/float64 spreads of other
    evaluation orders (the rebuilt graph's). The allowance ``T = TOL * max(1, scale) + 2 * S``, with ``S`` the
    largest measured float32 spread, the source's own ``max|a32 - z64|`` first: a target no farther from the exact
    function than ``T`` is ``ok``; one farther than ``TOL * max(1, scale) + FAIL_FACTOR * 2 * S`` FAILs; in
    between the spreads measured on this machine cannot decide, ``inconclusive``. A well-conditioned model (``S``
    far below the fixed term) is decided either way; only a measured spread opens the undecided band. Without
    ``z64`` the first-stage verdict stands."""
    if z64 is None or b is None or not np.isfinite(c.max_abs_err) or np.shape(z64) != np.shape(b):
        return c
    s = max([_max_abs(a32, z64), *spreads])
    d = _max_abs(b, z64)
    tol = c.tolerance + 2 * s
    verdict = "ok" if d <= tol else "fail" if d > c.tolerance + FAIL_FACTOR * 2 * s else "inconclusive"
    reason = "" if verdict == "ok" else (
        f"differs from the source's float64 run by {d:.3g}, {d / tol:.3g}x the float32 allowance {tol:.3g} "
        f"(the source's own float32 run differs from it by {_max_abs(a32, z64):.3g})" +
        ("" if verdict == "fail" else ": the float32 spreads measured cannot decide (an ill-conditioned model; "
         "shorter --inputs may decide)"))
    return LayerCheck(c.name, d, tol, c.max_abs_ref, c.source_route + " / float64", c.target_route, "float64",
                      verdict=verdict, reason=reason)


def _source_run(full: FullModel, m, feed, names: list[str]) -> tuple[list, dict]:
    """``(model outputs, {layer name: its output})`` of the source model ``m`` on ``feed``: one call of one model
    whose outputs are the model's and every top-level layer's of ``names`` (each layer runs once; a model per layer
    re-ran its prefix); the layers such a model cannot expose are probed one by one, as before, and those that
    cannot be probed alone are left out (the model outputs cover them)."""
    k = keras_config.import_keras3() if full.framework == "keras3" else None
    outs = list(m.outputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras 3 warns about list-vs-name input structures
        try:
            tensors = [m.get_layer(n).output for n in names]
            multi = (k.Model if k is not None else _tf_keras().Model)(m.inputs, outs + tensors)
            got = _call(multi, feed)
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            return list(got[:len(outs)]), dict(zip(names, got[len(outs):]))
        except (ValueError, AttributeError, KeyError, TypeError):
            pass
        y = m(feed, training=False)
        probed = {}
        for n in names:
            try:
                probed[n] = _sub_model(full, m, n)(feed, training=False)
            except (ValueError, AttributeError, KeyError, TypeError):
                continue
    return (list(y) if isinstance(y, (list, tuple)) else [y]), probed


#: inputs of more steps than this run the source through ``predict`` (one traced graph) instead of eagerly: an
#: eager Keras recurrent layer steps in Python (a real 1000-step BiGRU model: 54.5 s a call, 5.3 s by ``predict``)
EAGER_STEPS = 64


def _call(model, feed):
    """``model(feed)`` in inference mode; by ``predict`` (one batch) where the inputs are long (:data:`EAGER_STEPS`)."""
    first = feed[0] if isinstance(feed, (list, tuple)) else feed
    shape = np.shape(first)
    if len(shape) >= 2 and shape[1] is not None and shape[1] > EAGER_STEPS:
        return model.predict(feed, batch_size=max(1, shape[0]), verbose=0)
    return model(feed, training=False)


def _tf_keras():
    import tf_keras

    return tf_keras


def compare_whole(src_path: str, full: FullModel, run_target, route: str, inputs: dict[str, np.ndarray] | None = None,
                  seed: int = 0, run64=None, steps: int = keras_whole.STEPS, run32=None, padding: str = "any") -> list:
    """The whole-model check of a written file that another framework runs (issue #30: ONNX in onnxruntime, a
    ``.pt2`` program in torch): the source model run by tf_keras (file as stored, :func:`rnnconvert.formats.keras.keras_whole.source_model`)
    against ``run_target``, on ``inputs`` (``--inputs``: ``{model input name: array}``) or generated valid ones
    (:func:`rnnconvert.formats.keras.keras_whole.make_inputs`: token ids within each Embedding's range, masks with
    real padding at the end, the front and inside: :func:`rnnconvert.formats.keras.keras_whole.padded_steps`;
    ``padding='end'``: at the end only, for a file written for that).

    ``run_target(xs) -> (outputs, layers)``: ``xs`` the model inputs by name; ``outputs`` the model outputs in
    order, ``layers`` ``{top-level layer name: its output}`` for the layers the target exposes. Each is compared
    with tf_keras' by the rule of :func:`verify_model` (``max|d| <= TOL * max(1, max|ref|)``); one that misses it
    is judged again with ``+ 2 * max|y - y64|``, ``y64`` from ``run64(xs)`` (same form: the written graph run in
    float64), when given: the second stage of :mod:`rnnconvert.verify.engine`. With ``run32`` (the model of
    ``run64`` in float32: a graph rebuilt from the source, not read from the written file) ``y`` is its output,
    so the spread measures the model's conditioning and a wrong file cannot widen its own tolerance.

    Returns :class:`rnnconvert.verify.checks.LayerCheck` entries ``model output <i>`` and ``model:<layer>``.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs. DependencyError: no tf_keras.
    """
    tfm, names_in, xs = _source_and_inputs(src_path, full, inputs, seed, steps, padding)
    args = [xs[n] for n in names_in]
    src, fw = source_framework(full)
    outs, layers = run_target(xs)
    with keras_whole.guarded(f"{src.split(' (')[0]} running the source model (the reference of the whole-model "
                             "check)", full, None, fw):
        feed = args if len(args) > 1 else args[0]
        single = [lay.name for lay in tfm.layers if len(getattr(lay, "_inbound_nodes", [])) == 1
                  and type(lay).__name__ != "InputLayer" and not isinstance(lay.output, (list, tuple))
                  and lay.name in layers]
        y2, probed = _source_run(full, tfm, feed, single)
    pairs = [(f"model output {i}", i, np.asarray(a), b) for i, (a, b) in enumerate(zip(y2, outs))]
    pairs += [(f"model:{n}", n, np.asarray(probed[n]), layers[n]) for n in single if n in probed]
    checks, failed = [], []
    for name, key, a, b in pairs:
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            checks.append(LayerCheck(name, float("inf"), 0.0, float(np.max(np.abs(a), initial=0.0)), src, route,
                                     "float32", verdict="fail",
                                     reason=f"shape {b.shape} where the source gives {a.shape}"))
            continue
        ref = float(np.max(np.abs(a), initial=0.0))
        err = float(np.max(np.abs(a - b), initial=0.0))
        tol = TOL * max(1.0, ref)
        if not err <= tol:
            failed.append((len(checks), key, b))
        checks.append(LayerCheck(name, err, tol, ref, src, route, "float32", verdict="ok" if err <= tol else "fail",
                                 reason="" if err <= tol else f"differs by {err:.3g} (tolerance {tol:.3g})"))
    if failed:  # stage 2: the source's own float64 run decides (the rule of :func:`second_stage`)
        twin = source_float64(full, tfm)
        z64 = _twin_outputs(full, twin, [key for _, key, _ in failed], args) if twin is not None else {}
        o64, l64 = run64(xs) if run64 is not None else (None, None)
        o32, l32 = run32(xs) if run32 is not None else (None, None)
        for i, key, b in failed:
            a = pairs[[p[0] for p in pairs].index(checks[i].name)][2]
            z = z64.get(key)
            ours = []  # the rebuilt graph's own float32/float64 spread (a second float32 evaluation order)
            if o64 is not None and o32 is not None:
                p64 = o64[key] if isinstance(key, int) else l64.get(key)
                p32 = o32[key] if isinstance(key, int) else l32.get(key)
                if p64 is not None and p32 is not None:
                    ours.append(_max_abs(p64, p32))
                    if z is None:  # no float64 twin of the source: the rebuilt graph's float64 run is the reference
                        z = p64
            checks[i] = second_stage(checks[i], a, b, z, ours)
    if len(y2) != len(outs):
        checks.append(LayerCheck("model outputs (count)", float("inf"), 0.0, 0.0, src, route, "float32",
                                 verdict="fail", reason=f"{len(outs)} outputs where the source has {len(y2)}"))
    return checks
