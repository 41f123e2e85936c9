"""The end-to-end check of a Keras 2 model written whole as Keras 3 (the keras3 runtime's ``verify_whole``,
:mod:`rnnconvert.runtimes.keras3`): the source model run by tf_keras (the file as stored) against Keras 3 loading
the written ``.keras``, every top-level layer with one call and every model output; the same check for a
written ONNX graph, ``.pt2`` program, emitted module or ``.tflite`` (:func:`compare_whole`). Every comparison is
judged by the one rule of whole models (:func:`judge`, :func:`rnnconvert.verify.whole_rule.decide_whole`: ``ok``,
``inconclusive`` or ``fail``; the float64 reference and the source's float32 spreads measured only where the rule
asks for them; issue #39)."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import numpy as np

from ...formats.keras import keras_config, keras_whole
from ...errors import FormatError, UnsupportedError
from ...safety import keras_sanitize
from ...verify.checks import LayerCheck, whole_stage
from ...formats.keras.keras_whole import TOL, FullModel
from ...verify import verdict as layer_verdict
from ...verify.whole_rule import ASK, WholeFindings, decide_whole


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
    (``max|y32 - y64|``): the float64 twin of a Keras 3 source (:func:`source_float64`)."""
    try:
        cls = type(model).__name__ if type(model).__name__ in keras_sanitize.CONTAINERS else "Functional"
        cfg = keras_sanitize.model_config({"class_name": cls, "config": as_float64(model.get_config())},
                                          "the written model")["config"]  # the whitelist first (issue #40)
        twin = type(model).from_config(cfg)
        twin.set_weights([np.asarray(w, np.float64) for w in model.get_weights()])
        return twin
    except Exception as exc:  # noqa: BLE001 - whatever Keras 3 / TensorFlow raise: no float64 twin
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


def _named_inputs(names_in: list[str], inputs: dict) -> dict[str, np.ndarray]:
    """``inputs`` (given model inputs) as arrays in the model's input order ``names_in``.

    Raises:
        FormatError: ``inputs`` that do not name exactly the model's inputs."""
    missing = [n for n in names_in if n not in inputs]
    extra = [n for n in inputs if n not in names_in]
    if missing or extra:
        raise FormatError(f"whole-model verification inputs must name the model inputs "
                          f"{', '.join(names_in)}; missing {missing}, unknown {extra}")
    return {n: np.asarray(inputs[n]) for n in names_in}


def _source_and_inputs(src_path: str, full: FullModel, inputs: dict[str, np.ndarray] | None, seed: int,
                       steps: int = keras_whole.STEPS, padding: str = "any"):
    """The source model in tf_keras (the file as stored), its input names, and the inputs both sides run on:
    ``inputs`` (``--inputs``, which must name exactly the model's inputs) or generated valid ones.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    whole_stage("loading the source model")
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
        xs = _named_inputs(names_in, inputs)
    else:
        xs = keras_whole.make_inputs(tfm, full.config, seed, steps, padding)
    return tfm, names_in, xs


def verify_model(src_path: str, dst_path: str, full: FullModel, inputs: dict[str, np.ndarray] | None = None,
                 seed: int = 0, run32=None, run64=None) -> list:
    """Compare the source model (tf_keras, file as stored) with the written ``.keras`` (Keras 3 rebuilding it):
    every top-level layer with one call and every model output, by the one rule of whole models (:func:`judge`); on
    generated inputs, the fully masked batch too (:func:`compare_whole`, :func:`with_fully_masked`).

    Args:
        inputs: ``{model input name: array}`` (``--inputs``), else generated (:func:`rnnconvert.formats.keras.keras_whole.make_inputs`).
        run32, run64: the source's graph rebuilt and run in float32 and float64, as :func:`compare_whole` takes them
            (one more float32 evaluation order for the spreads), or ``None``.

    Returns:
        :class:`rnnconvert.verify.checks.LayerCheck` entries named ``model:<layer>`` and ``model output <i>``.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs. DependencyError: no tf_keras.
    """
    import os
    import shutil
    import tempfile

    from ...formats.keras import keras3

    k = keras_config.import_keras3()
    tfm, names_in, xs = _source_and_inputs(src_path, full, inputs, seed)
    whole_stage("running the written model")
    with tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        local = os.path.join(tmp, "model.keras")
        shutil.copyfile(dst_path, local)
        with keras_whole.guarded("Keras 3 loading the written model", full, None, "keras"):
            new = keras3.built_archive(k, local)  # never load_model (issue #40)
    single = [lay.name for lay in tfm.layers if len(getattr(lay, "_inbound_nodes", [])) == 1
              and type(lay).__name__ != "InputLayer" and not isinstance(lay.output, (list, tuple))]

    def one(xs):
        args = [xs[n] for n in names_in]
        feed = args if len(args) > 1 else args[0]
        y3, got3 = _keras3_run(k, full, new, args, single)
        whole_stage("running the source model")
        with keras_whole.guarded("tf_keras running the source model (the reference of the whole-model check)", full,
                                 None, "tf_keras"):
            y2, probed = _source_run(full, tfm, feed, [n for n in single if n in got3])
        pairs = [(f"model output {i}", i, a, b) for i, (a, b) in enumerate(zip(y2, y3))]
        pairs += [(f"model:{n}", n, probed[n], got3[n]) for n in single if n in got3 and n in probed]
        checks = judge(pairs, "tf_keras (whole model)", "keras 3 load_model",
                       lambda keys: _measure_spreads(full, tfm, keys, args, run32, run64, xs))
        if len(y2) != len(y3):
            checks.append(LayerCheck("model outputs (count)", float("inf"), 0.0, 0.0, "tf_keras (whole model)",
                                     "keras 3 load_model", "float32", verdict="fail",
                                     reason=f"{len(y3)} outputs where the source has {len(y2)}"))
        return checks

    checks = one(xs)
    xf = None if inputs else keras_whole.fully_masked_inputs(tfm, full.config, seed)
    return checks if xf is None else with_fully_masked(checks, one(xf))


def _keras3_run(k, full: FullModel, new, args: list, names: list[str]) -> tuple[list, dict]:
    """``(model outputs, {layer name: its output})`` of the written Keras 3 model ``new`` on ``args``, as numpy: one
    call of one model whose outputs are the model's and every top-level layer's of ``names`` (each layer runs once);
    where Keras 3 cannot build that model, the model and then each layer alone, a layer that cannot be probed alone
    left out (the model outputs cover it)."""
    def numpy(y):
        return [k.ops.convert_to_numpy(t) for t in (y if isinstance(y, (list, tuple)) else [y])]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras 3 warns about list-vs-name input structures
        with keras_whole.guarded("Keras 3 running the written model", full, None, "keras"):
            outs = list(new.outputs)
            try:
                tensors = [new.get_layer(n).output for n in names]
                got = numpy(_call(k.Model(new.inputs, outs + tensors), args))
                return got[:len(outs)], dict(zip(names, got[len(outs):]))
            except (ValueError, AttributeError, KeyError, TypeError):
                pass
            y3 = numpy(new(args, training=False))
            probed = {}
            for n in names:
                try:
                    probed[n] = numpy(k.Model(new.inputs, new.get_layer(n).output)(args, training=False))[0]
                except (ValueError, AttributeError, KeyError, TypeError):
                    continue
    return y3, probed


def _max_abs(a, b) -> float:
    """``max|a - b|`` over the positions where either is finite: a position where both hold the same non-finite
    value (NaN and NaN, or the same infinity) is not compared (a source's own NaN, e.g. tf_keras' masked mean over
    a wholly masked row, against the same NaN), a position where one is not finite, or both but not the same, is
    ``inf``; 0.0 for empty arrays."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    if not np.isfinite(d).all():
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
    return float(np.max(d, initial=0.0))


def nonfinite_mismatch(a, b) -> str:
    """``''`` where ``b`` (the target's output) is non-finite exactly where ``a`` (the source's) is, with the same value
    (NaN for NaN, the same infinity); otherwise the mismatch in words (how many positions, and the first one): the
    whole-model rule's rule 1 (:func:`rnnconvert.verify.whole_rule.decide_whole`). Arrays of one shape."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = ~np.isfinite(a), ~np.isfinite(b)
    if not na.any() and not nb.any():
        return ""
    bad = (na != nb) | (na & nb & ~((a == b) | (np.isnan(a) & np.isnan(b))))
    if not bad.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"first at index {first}: {b[first]:g} where the source gives {a[first]:g}"
    n_fin, n_non = int((bad & na & ~nb).sum()), int((bad & ~na).sum())
    parts = ([f"{n_fin} finite value(s) where the source's output is not finite (NaN or infinite)"] if n_fin else []) + \
        ([f"{n_non} non-finite value(s) where the source's output is finite"] if n_non else [])
    other = int(bad.sum()) - n_fin - n_non
    if other:
        parts.append(f"{other} non-finite value(s) other than the source's non-finite value there")
    return "the written model's output has " + "; ".join(parts) + f" ({where})"


def source_float64(full: FullModel, model):
    """The source model rebuilt in float64 by its own framework (tf_keras or Keras 3) from the built model's
    config, every weight widened exactly, or ``None`` when the framework cannot rebuild it: the float64 reference
    of :func:`judge` (:func:`_measure_spreads`); it depends on SRC only, so a written file cannot
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
                  seed: int = 0, run64=None, steps: int = keras_whole.STEPS, run32=None, padding: str = "any",
                  graph=None) -> list:
    """The whole-model check of a written file that another framework runs (issue #30: ONNX in onnxruntime, a
    ``.pt2`` program in torch): the source model run by tf_keras (file as stored, :func:`rnnconvert.formats.keras.keras_whole.source_model`)
    against ``run_target``, on ``inputs`` (``--inputs``: ``{model input name: array}``) or generated valid ones
    (:func:`rnnconvert.formats.keras.keras_whole.make_inputs`: token ids within each Embedding's range, masks with
    real padding at the end, the front and inside: :func:`rnnconvert.formats.keras.keras_whole.padded_steps`;
    ``padding='end'``: at the end only, for a file written for that). Generated inputs of a model whose inputs carry
    a mask are followed by a second, small batch with a row whose every step is masked
    (:func:`rnnconvert.formats.keras.keras_whole.fully_masked_inputs`), judged alike and folded into the main
    batch's checks by :func:`with_fully_masked` (docs/cli.md "The fully masked row").

    ``run_target(xs) -> (outputs, layers)``: ``xs`` the model inputs by name; ``outputs`` the model outputs in
    order, ``layers`` ``{top-level layer name: its output}`` for the layers the target exposes. Each is compared
    with the source's by the one rule of whole models (:func:`judge`). ``run32``/``run64`` (given together: a graph
    rebuilt from the SOURCE's config and weights, never read from the written file, run in float32 and float64)
    give one more independent float32 evaluation order for the spreads (and the float64 reference where the
    source's framework cannot rebuild the model in float64); a wrong file cannot widen its own tolerance.

    ``graph`` (a zero-argument callable returning the SOURCE's :class:`rnnconvert.whole.conventions.keras_graph.
    Graph`, or ``None``): where given, the source side is the numpy evaluator of that graph
    (:mod:`rnnconvert.whole.verify.numpy_source`: float32, a second float32 order and float64 from the file's
    weights; no TensorFlow imported), unless ``RNNCONVERT_SOURCE_ORACLE=framework`` or the graph holds a layer
    the evaluator does not compute: then the source framework runs it, as without ``graph``.

    Returns :class:`rnnconvert.verify.checks.LayerCheck` entries ``model output <i>`` and ``model:<layer>``.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs. DependencyError: no tf_keras.
    """
    g = numpy_graph(graph, full)
    if g is not None:
        checks = _compare_numpy(g, full, run_target, route, inputs, seed, run64, steps, run32, padding)
        if checks is not None:
            return checks
    tfm, names_in, xs = _source_and_inputs(src_path, full, inputs, seed, steps, padding)
    src, fw = source_framework(full)

    def one(xs):
        args = [xs[n] for n in names_in]
        whole_stage("running the written model")
        outs, layers = run_target(xs)
        whole_stage("running the source model")
        with keras_whole.guarded(f"{src.split(' (')[0]} running the source model (the reference of the whole-model "
                                 "check)", full, None, fw):
            feed = args if len(args) > 1 else args[0]
            single = [lay.name for lay in tfm.layers if len(getattr(lay, "_inbound_nodes", [])) == 1
                      and type(lay).__name__ != "InputLayer" and not isinstance(lay.output, (list, tuple))
                      and lay.name in layers]
            y2, probed = _source_run(full, tfm, feed, single)
        pairs = [(f"model output {i}", i, np.asarray(a), b) for i, (a, b) in enumerate(zip(y2, outs))]
        pairs += [(f"model:{n}", n, np.asarray(probed[n]), layers[n]) for n in single if n in probed]
        checks = judge(pairs, src, route, lambda keys: _measure_spreads(full, tfm, keys, args, run32, run64, xs))
        if len(y2) != len(outs):
            checks.append(LayerCheck("model outputs (count)", float("inf"), 0.0, 0.0, src, route, "float32",
                                     verdict="fail", reason=f"{len(outs)} outputs where the source has {len(y2)}"))
        return checks

    checks = one(xs)
    xf = None if inputs else keras_whole.fully_masked_inputs(tfm, full.config, seed, steps, padding)
    return checks if xf is None else with_fully_masked(checks, one(xf))


#: the words a check judged on the fully masked batch (:func:`with_fully_masked`) starts its reason with
FULLY_MASKED = ("on the generated fully masked row (every step of every masked input masked: "
                "keras_whole.fully_masked_inputs)")


def with_fully_masked(checks: list, extra: list) -> list:
    """The checks of the main batch (``checks``) with those of the fully masked batch (``extra``,
    :func:`rnnconvert.formats.keras.keras_whole.fully_masked_inputs`) folded in, by name: a check the fully masked
    batch judges worse (``fail`` over ``inconclusive`` over ``ok``) is replaced by that batch's, its reason starting
    with :data:`FULLY_MASKED`; otherwise the main batch's check stands as it was (a correct conversion's report is
    the one it was without the fully masked batch). A check only the fully masked batch has is added where it is
    not ``ok``."""
    import dataclasses

    rank = {"ok": 0, "inconclusive": 1, "fail": 2}
    by = {c.name: i for i, c in enumerate(checks)}
    out = list(checks)
    for c in extra:
        i = by.get(c.name)
        if rank.get(c.verdict, 2) <= (rank.get(out[i].verdict, 2) if i is not None else 0):
            continue
        c = dataclasses.replace(c, reason=f"{FULLY_MASKED}: {c.reason}" if c.reason else FULLY_MASKED)
        if i is None:
            out.append(c)
        else:
            out[i] = c
    return out


#: the whole-model rule's relative term (:func:`rnnconvert.verify.whole_rule.decide_whole`'s ``first``) and the
#: largest tolerance, as a fraction of the output's scale, at which it still decides (float32:
#: :func:`rnnconvert.verify.verdict.fraction`)
FIRST, RHO = TOL, layer_verdict.fraction(2.0 ** -24)


def judge(pairs: list, src: str, route: str, measure) -> list:
    """The checks of ``pairs`` (``[(name, key, a32, b)]``: the source's float32 output and the target's, ``key`` a
    model output index or a top-level layer name) by :func:`rnnconvert.verify.whole_rule.decide_whole`, the one
    rule of whole models (issue #39). ``measure(keys) -> ({key: z64}, {key: {what: spread}}, why_none)`` measures
    the float64 reference and the source's float32 spreads, called once, for the keys that need them only (rule 3).

    Returns :class:`rnnconvert.verify.checks.LayerCheck` entries in the order of ``pairs``."""
    found, arrays = [], []
    for name, key, a, b in pairs:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        arrays.append((a, b))
        scale = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0))  # a source's own NaN gives no scale
        if a.shape != b.shape:
            found.append(WholeFindings(math.inf, scale, shape=f"shape {b.shape} where the source gives {a.shape}"))
            continue
        bad = nonfinite_mismatch(a, b)
        if bad:
            found.append(WholeFindings(math.inf, scale, nonfinite=bad))
            continue
        err = _max_abs(a, b)  # the source's own non-finite values, matched by the target's, are not compared
        found.append(WholeFindings(err, scale))
    outs = [decide_whole(f, FIRST, RHO) for f in found]
    asked = [i for i, o in enumerate(outs) if o.get("ask")]
    if asked:
        z64, spreads, why = measure([pairs[i][1] for i in asked])
        for i in asked:
            key, (a, b), f = pairs[i][1], arrays[i], found[i]
            z = z64.get(key)
            ok_shape = z is not None and np.shape(z) == b.shape
            own = {"the source framework's float32 run against the float64 reference": _max_abs(a, z)} \
                if ok_shape else {}
            found[i] = WholeFindings(f.err32, f.scale, err64=_max_abs(b, z) if ok_shape else None,
                                     spreads={**spreads.get(key, {}), **own} if ok_shape else {},
                                     why_none=why if z is None else "" if ok_shape else "its float64 run has "
                                     "another shape")
            outs[i] = decide_whole(found[i], FIRST, RHO)
    checks = []
    for (name, *_), o in zip(pairs, outs):
        ref64 = o["reference"] == "float64"
        checks.append(LayerCheck(name, o["max_abs_err"], o["tolerance"], o["max_abs_ref"],
                                 src + (" / float64" if ref64 else ""), route, "float64" if ref64 else "float32",
                                 verdict=o["verdict"], reason=o["reason"]))
    return checks


def _measure_spreads(full: FullModel, tfm, keys: list, args: list, run32, run64, xs: dict):
    """``({key: z64}, {key: {what: spread}}, why_none)`` for :func:`judge`: ``z64`` the source model run in float64
    by its own framework (:func:`source_float64`), else the graph rebuilt from the source's config and weights run in
    float64 (``run64``); the spreads ``max|y32 - z64|`` of the source's own further float32 evaluations (:func:`judge`
    adds its framework's float32 run's): with ``run32``/``run64`` (a graph rebuilt from the SOURCE, never read from the written file),
    that graph's float32 run against its float64 run (another, independent float32 evaluation order). Nothing here
    depends on the written file: it cannot widen its own tolerance."""
    whole_stage("measuring the source's float32 spreads")
    twin = source_float64(full, tfm)
    z64 = _twin_outputs(full, twin, keys, args) if twin is not None else {}
    o32 = l32 = o64 = l64 = None
    if run32 is not None and run64 is not None:
        try:
            o64, l64 = run64(xs)
            o32, l32 = run32(xs)
        except Exception as exc:  # noqa: BLE001 - a graph the rebuild cannot run: its spread is not measured
            if keras_whole.passes(exc):
                raise
            o32 = o64 = None
    refs, spreads = {}, {}
    for key in keys:
        got = {}
        z = z64.get(key)
        if o64 is not None and o32 is not None:
            p64 = o64[key] if isinstance(key, int) and key < len(o64) else (l64 or {}).get(key)
            p32 = o32[key] if isinstance(key, int) and key < len(o32) else (l32 or {}).get(key)
            if p64 is not None and p32 is not None and np.shape(p64) == np.shape(p32):
                got["the source's graph rebuilt in torch, float32 against float64"] = _max_abs(p32, p64)
                z = p64 if z is None else z
        if z is not None:
            refs[key], spreads[key] = np.asarray(z, np.float64), got
    why = "" if refs else "the source framework cannot rebuild the model in float64"
    return refs, spreads, why


#: the environment variable choosing the source side of the whole-model check (docs/cli.md): ``numpy`` (default:
#: :mod:`rnnconvert.whole.verify.numpy_source` where it covers the model) or ``framework`` (tf_keras / Keras 3)
SOURCE_ORACLE_ENV = "RNNCONVERT_SOURCE_ORACLE"


def numpy_graph(graph, full: FullModel):
    """The source graph the numpy evaluator runs for :func:`compare_whole`, or ``None`` (the source framework runs
    the source instead): ``graph`` not given, :data:`SOURCE_ORACLE_ENV` set to ``framework``, a Keras 3 source
    (Keras 3 runs it; its recurrent layers carry no raw Keras tensors), a SavedModel folder (the evaluator is
    tested against tf_keras on Keras HDF5 fixtures only), a graph that cannot be built or holds a call the evaluator does not compute
    (:func:`rnnconvert.whole.verify.numpy_source.uncovered`)."""
    from ...process import settings
    from . import numpy_source

    if graph is None or full.framework == "keras3" or full.origin != "file" \
            or settings.value(SOURCE_ORACLE_ENV) == "framework":
        return None
    try:
        g = graph() if callable(graph) else graph
    except (UnsupportedError, FormatError, ValueError, KeyError, TypeError):
        return None
    return g if g is not None and not numpy_source.uncovered(g) else None


def graph_inputs(g, full: FullModel, inputs: dict | None, seed: int, steps: int, padding: str,
                 fully_masked: bool = False) -> dict | None:
    """The inputs of the numpy source run: ``inputs`` (``--inputs``, naming exactly the graph's inputs, the
    model's input layers) or the generated ones :func:`rnnconvert.formats.keras.keras_whole.make_inputs` makes for
    the source framework's model (the same arrays: the same names, shapes and seed); ``fully_masked`` (no
    ``inputs``): the fully masked batch :func:`rnnconvert.formats.keras.keras_whole.fully_masked_inputs` makes for
    it, ``None`` where no input carries a mask.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    from types import SimpleNamespace

    names_in = [n for n, *_ in g.inputs]
    if inputs:
        return _named_inputs(names_in, inputs)
    shim = SimpleNamespace(inputs=[SimpleNamespace(name=n, shape=(None,) + tuple(shp)) for n, shp, *_ in g.inputs])
    if fully_masked:
        return keras_whole.fully_masked_inputs(shim, full.config, seed, steps, padding)
    return keras_whole.make_inputs(shim, full.config, seed, steps, padding)


def compared_layers(g) -> list[str]:
    """The graph's calls the check compares, as the framework path does (:func:`compare_whole`): top-level layers
    called once with one output."""
    shared = {n.path for n in g.nodes if n.name != n.path}
    return [n.name for n in g.nodes if "." not in n.path and n.path not in shared and len(n.outputs) == 1]


#: the source route of the numpy evaluator in the report
NUMPY_ROUTE = "numpy (the source graph from the file's weights)"


def _compare_numpy(g, full: FullModel, run_target, route: str, inputs, seed: int, run64, steps: int, run32,
                   padding: str):
    """:func:`compare_whole` with the numpy evaluator as the source side; ``None`` where it cannot run the model on
    these inputs (the framework path then runs)."""
    xs = graph_inputs(g, full, inputs, seed, steps, padding)
    checks = _compare_numpy_on(g, xs, run_target, route, run64, run32)
    xf = None if inputs or checks is None else graph_inputs(g, full, None, seed, steps, padding, fully_masked=True)
    if xf is None:
        return checks
    extra = _compare_numpy_on(g, xf, run_target, route, run64, run32)
    return None if extra is None else with_fully_masked(checks, extra)


def _compare_numpy_on(g, xs: dict, run_target, route: str, run64, run32):
    """:func:`_compare_numpy` on the model inputs ``xs``; ``None`` where the numpy evaluator cannot run them."""
    from . import numpy_source

    whole_stage("running the source model (numpy)")
    try:
        y2, probed = numpy_source.run(g, xs, np.float32)
    except (numpy_source.Uncovered, *keras_graph_errors()):  # the framework path refuses it in its own words
        return None
    whole_stage("running the written model")
    outs, layers = run_target(xs)
    single = [n for n in compared_layers(g) if n in layers and n in probed]
    pairs = [(f"model output {i}", i, a, b) for i, (a, b) in enumerate(zip(y2, outs))]
    pairs += [(f"model:{n}", n, probed[n], layers[n]) for n in single]

    def measure(keys):
        whole_stage("measuring the source's float32 spreads (numpy)")
        try:
            o64, l64 = numpy_source.run(g, xs, np.float64)
            o32, l32 = numpy_source.run(g, xs, np.float32, order=1)
        except (numpy_source.Uncovered, *keras_graph_errors()):
            return {}, {}, "the numpy evaluator could not run the source in float64"
        refs, spreads = {}, {}
        for key in keys:
            z, b = (o64[key], o32[key]) if isinstance(key, int) else (l64.get(key), l32.get(key))
            if z is not None and b is not None:
                refs[key], spreads[key] = z, {"numpy float32, contractions reversed, against float64": _max_abs(b, z)}
        _torch_spreads(refs, spreads, keys, xs, run32, run64)
        return refs, spreads, "" if refs else "the numpy evaluator gave no float64 run"

    checks = judge(pairs, NUMPY_ROUTE, route, measure)
    if len(y2) != len(outs):
        checks.append(LayerCheck("model outputs (count)", float("inf"), 0.0, 0.0, NUMPY_ROUTE, route, "float32",
                                 verdict="fail", reason=f"{len(outs)} outputs where the source has {len(y2)}"))
    return checks


def keras_graph_errors() -> tuple:
    """What evaluating a malformed (untrusted) config's values can raise in numpy
    (:data:`rnnconvert.whole.conventions.keras_graph.CONFIG_ERRORS`)."""
    from ..conventions import keras_graph

    return keras_graph.CONFIG_ERRORS


def _torch_spreads(refs: dict, spreads: dict, keys: list, xs: dict, run32, run64) -> None:
    """One more float32 evaluation order (the source's graph rebuilt in torch, ``run32``/``run64``) added to
    ``spreads`` in place, where given and it runs."""
    if run32 is None or run64 is None:
        return
    try:
        o64, l64 = run64(xs)
        o32, l32 = run32(xs)
    except Exception as exc:  # noqa: BLE001 - a graph the rebuild cannot run: its spread is not measured
        if keras_whole.passes(exc):
            raise
        return
    for key in keys:
        p64 = o64[key] if isinstance(key, int) and key < len(o64) else (l64 or {}).get(key)
        p32 = o32[key] if isinstance(key, int) and key < len(o32) else (l32 or {}).get(key)
        if key in refs and p64 is not None and p32 is not None and np.shape(p64) == np.shape(p32):
            spreads[key]["the source's graph rebuilt in torch, float32 against float64"] = _max_abs(p32, p64)


def graph_fed(ckpt, full: FullModel | None, inputs: dict | None = None, seed: int = 0,
              steps: int = keras_whole.STEPS) -> dict | None:
    """The inputs the whole model's graph feeds each recurrent layer (issue #39: the per-layer check runs on them
    too): ``{layer name: [(x, mask)]}``, one per call of the layer in the graph's order, ``x`` float32 ``(B, T,
    input_size)`` the numpy evaluator's input of that call (:func:`rnnconvert.whole.verify.numpy_source.run`,
    float32, order 0: the source side of the whole-model check) on the whole-model check's model inputs (``inputs``, ``--inputs`` naming the model inputs,
    else :func:`rnnconvert.formats.keras.keras_whole.make_inputs` with ``seed`` and ``steps``: the same arrays),
    ``mask`` its Keras mask (bool ``(B, T)``) or ``None``. ``None`` where the numpy evaluator does not cover the
    model (:func:`numpy_graph`; :class:`~rnnconvert.whole.verify.numpy_source.Uncovered`), or no whole model:
    the per-layer check then runs on its own batch alone, as before.

    Raises:
        FormatError: ``inputs`` that do not name the model's inputs."""
    from . import numpy_source
    from ..conventions import keras_graph

    if full is None:
        return None
    g = numpy_graph(lambda: keras_graph.build(full.config, full.weights, ckpt), full)
    if g is None:
        return None
    xs = graph_inputs(g, full, inputs, seed, steps, "any")
    fed: dict = {}
    try:
        numpy_source.run(g, xs, np.float32, fed=fed)
    except (numpy_source.Uncovered, *keras_graph_errors()):
        return None
    names = {layer.name for layer in ckpt.layers}
    return {k: [(np.asarray(x, np.float32), m) for x, m in calls if np.ndim(x) == 3]
            for k, calls in fed.items() if k in names and any(np.ndim(x) == 3 for x, _ in calls)}
