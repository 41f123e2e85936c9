"""A whole Keras 1/2 model written as one ``.tflite`` flatbuffer by TensorFlow Lite's own converter (issue #41;
reached through the ``tflite`` container's record, :func:`rnnconvert.formats.tflite.tflite_write.container_check`
and ``container_write``, with the engine's write option ``whole_model``).

How (TensorFlow 2.21, ``tf.lite.TFLiteConverter.from_concrete_functions``, float32, built-in ops only):

* the model is rebuilt by tf_keras from its config *as rebuilt from rnnconvert's whitelist*
  (:func:`rnnconvert.formats.keras.keras_whole.source_model`: ``model_from_json`` on
  :func:`rnnconvert.safety.keras_sanitize.model_config`'s output, then tf_keras' HDF5 weight loader, or
  ``layer.set_weights`` with a SavedModel's weights as read; never ``load_model``, the file's raw config never
  reaches a framework loader), after the whole-model compiler's own
  whitelist of layer classes (:func:`rnnconvert.whole.conventions.keras_graph.build`, the refusals the ONNX and
  ``.pt2`` writers give);
* one signature ``serving_default``: inputs named as the model's (float32, or int32 token ids), outputs
  ``output_<i>`` (the model outputs in order) and ``layer_<name>`` (each top-level layer called once with one
  output: what the whole-model check compares layer by layer, as the whole-model ONNX graph's ``layer:<name>``);
* an unmasked Keras ``LSTM`` with sigmoid gates and tanh comes out fused: ``UNIDIRECTIONAL_SEQUENCE_LSTM``
  (a ``Bidirectional(LSTM)``: two of them around ``REVERSE_V2``; TF 2.21's converter emits no
  ``BIDIRECTIONAL_SEQUENCE_LSTM`` for Keras models). Any other recurrent layer (GRU, SimpleRNN, an LSTM with
  ``hard_sigmoid`` gates or a mask) is a ``WHILE`` loop whose body holds the cell's ops; the interpreter runs both;
  the whole-model check (:mod:`rnnconvert.whole.runtimes.tflite_whole`) decides whether it ran them exactly;
* time is free (``shape_signature`` -1); the batch is fixed at the write option ``batch`` (default 1) in a model
  with recurrent layers: TF 2.21's converter fuses a Keras LSTM at a fixed batch only (``CheckFusableKerasLstm``)
  and a ``WHILE`` loop's tensor lists need a static element shape (converter: "'tf.TensorListReserve' op requires
  element_shape to be static"); the report's line says so. Other models keep the batch free;
* the converter's ``cell_clip=10`` on every fused LSTM op is removed (:func:`unclipped`): Keras does not clip.

Refused (:class:`~rnnconvert.errors.UnsupportedError`, one line): a Keras 3 source (this writer rebuilds with
tf_keras), a layer outside the whole-model writers' classes (by name and class), and whatever the converter cannot
lower to built-in TFLite ops (its first error line, which names the layer's op). No framework is imported at
module import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ....conventions.full_model import WAY_OUT
from ....core.model import Checkpoint
from ....errors import OptionError, UnsupportedError, WholeModelError, require

ROUTE = "tf.lite.Interpreter (whole model)"
#: the signature every whole-model file holds
SIGNATURE = "serving_default"
#: recurrent ops the converter fuses; every other recurrence is a WHILE loop
FUSED = ("UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM")
#: the converter's refusal of a free batch around a WHILE loop's tensor lists
_STATIC = "element_shape to be static"


def _batch(batch: Any) -> int:
    try:
        b = int(batch)
    except (TypeError, ValueError):
        b = 0
    if b < 1 or str(batch).strip() != str(b):
        raise OptionError(f"tflite writer: batch={batch!r}: expected a positive integer")
    return b


def check(ckpt: Checkpoint, *, whole_model: Any, batch: Any = 1, **_: Any) -> list[str]:
    """Refuse what this writer cannot build (module docstring); return notes. Marks ``ckpt.meta['whole_program']``:
    the written file runs whole only (its layers are checked inside the model by the whole-model check).

    Raises:
        WholeModelError: a Keras 3 source, a layer class outside the whitelist (layer, class, way out): the
            engine then writes the recurrent layers alone with a note, unless ``whole=True``.
        OptionError: ``batch`` not a positive integer."""
    from ...conventions import keras_graph

    _batch(batch)
    if getattr(whole_model, "framework", "tf_keras") != "tf_keras" or not hasattr(whole_model, "config"):
        why = "the whole-model .tflite writer rebuilds Keras 1/2 models with tf_keras; this is a Keras 3 model"
        raise WholeModelError(f"{Path(str(whole_model.path)).name}: {why}; {WAY_OUT}", reason=why)
    graph = keras_graph.build(whole_model.config, whole_model.weights, ckpt)  # the whitelist, by layer name
    ckpt.meta["whole_program"] = True
    return [f"whole model written: {len(graph.nodes)} layer call(s) converted by TensorFlow Lite's converter "
            "(float32, built-in ops); signature 'serving_default', outputs 'output_<i>' and 'layer_<name>'"]


def tf_keras_model(full, ckpt: Checkpoint):
    """The whole model in tf_keras, built from the whitelisted config (:func:`rnnconvert.formats.keras.keras_whole.
    source_model`, as the whole-model check builds its reference): an HDF5 file's weights loaded by tf_keras' HDF5
    weight loader (datasets only; it also maps Keras 1 and CuDNN layouts), a SavedModel's given as the reader
    found them (``layer.set_weights``)."""
    from ....formats.keras import keras_whole

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    with keras_whole.guarded("tf_keras rebuilding the model for the TFLite converter", full, None, "tf_keras"):
        return keras_whole.source_model(str(full.path), full.config,
                                        full.weights if full.origin == "weights" else None)


def exposed(model) -> list[str]:
    """The top-level layers whose output the file exposes as ``layer_<name>`` (called once, one output)."""
    return [lay.name for lay in model.layers if len(getattr(lay, "_inbound_nodes", [])) == 1
            and type(lay).__name__ != "InputLayer" and not isinstance(lay.output, (list, tuple))]


def _convert(tf, model, batch: int | None) -> bytes:
    """The flatbuffer of ``model`` with the batch free (``None``) or fixed, time free."""
    import tf_keras

    names = exposed(model)
    probe = tf_keras.Model(model.inputs, list(model.outputs) + [model.get_layer(n).output for n in names])
    n_out = len(model.outputs)
    specs = [tf.TensorSpec([batch] + list(t.shape[1:]), t.dtype, name=t.name.split(":")[0]) for t in model.inputs]

    def run(*xs):
        ys = probe(list(xs) if len(xs) > 1 else xs[0], training=False)
        ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
        out = {f"output_{i}": y for i, y in enumerate(ys[:n_out])}
        out.update({f"layer_{n}": y for n, y in zip(names, ys[n_out:])})
        return out

    fn = tf.function(run).get_concrete_function(*specs)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn], probe)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return conv.convert()


def _first_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if "error:" in ln]
    text = lines[0].split("error:", 1)[1].strip() if lines else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:300]


def _model_object(content: bytes):
    from tensorflow.lite.tools import flatbuffer_utils

    return flatbuffer_utils.convert_bytearray_to_object(bytearray(content))


def ops_of(content: bytes) -> list[str]:
    """The op names of every subgraph of a flatbuffer (TensorFlow's schema object API,
    ``tensorflow.lite.tools.flatbuffer_utils``)."""
    from tensorflow.lite.tools import flatbuffer_utils

    m = _model_object(content)
    return [flatbuffer_utils.opcode_to_name(m, op.opcodeIndex) for g in m.subgraphs for op in g.operators or []]


def unclipped(content: bytes) -> tuple[bytes, int]:
    """``content`` with the ``cell_clip`` of every fused LSTM op set to 0 (none), and how many ops had one.

    TF 2.21's converter writes a Keras LSTM as ``UNIDIRECTIONAL_SEQUENCE_LSTM`` with ``cell_clip=10``
    (``prepare_composite_functions_tf.cc``; measured, docs/tflite.md "Traps"), which the Keras layer does not
    have: where ``|c|`` passes 10 the interpreter's output leaves the model's (``fixtures/tflite/clip_trap.tflite``).
    A clip of 0 is the schema's "no clip" (``schema.fbs``, ``lstm_eval.cc``); the weights are untouched. Edited and
    re-serialised with TensorFlow's schema object API (``flatbuffer_utils``)."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    m = _model_object(content)
    ops = (schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM, schema.BuiltinOperator.BIDIRECTIONAL_SEQUENCE_LSTM)
    n = 0
    for g in m.subgraphs:
        for op in g.operators or []:
            code = m.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) in ops and op.builtinOptions.cellClip != 0:
                op.builtinOptions.cellClip = 0.0
                n += 1
    return (bytes(flatbuffer_utils.convert_object_to_bytearray(m)) if n else content), n


def _recurrent(model) -> bool:
    from ....conventions.full_model import RECURRENT

    def walk(lay) -> bool:
        inner = [getattr(lay, a) for a in ("layer", "forward_layer", "backward_layer") if hasattr(lay, a)]
        return type(lay).__name__ in RECURRENT or any(walk(i) for i in inner) or any(
            walk(sub) for sub in getattr(lay, "layers", []) if sub is not lay)
    return any(walk(lay) for lay in model.layers)


def write(ckpt: Checkpoint, path: str | Path, *, whole_model: Any, batch: Any = 1, **_: Any) -> list[str]:
    """Write ``whole_model`` to ``path`` (a temporary path the engine renames into place once verified); returns
    the lines of the report that say what the file holds and how to run it. Assumes :func:`check` passed.

    Raises:
        UnsupportedError: what the converter cannot lower to built-in ops (its first error line)."""
    tf = require("tensorflow", "tensorflow")
    b = _batch(batch)
    model = tf_keras_model(whole_model, ckpt)
    # TF 2.21's converter fuses a Keras LSTM at a fixed batch only (CheckFusableKerasLstm) and lowers a WHILE
    # loop's tensor lists only with static element shapes: a model with recurrent layers is converted at `batch`
    fixed = b if _recurrent(model) else None
    try:
        content = _convert(tf, model, fixed)
    except Exception as exc:  # noqa: BLE001 - the converter's errors (ConverterError and what MLIR raises)
        if fixed is not None or _STATIC not in str(exc):
            raise UnsupportedError(f"{Path(str(whole_model.path)).name}: TensorFlow Lite's converter cannot lower "
                                   f"this model to built-in ops: {_first_error(exc)}; {WAY_OUT}") from None
        fixed = b
        try:
            content = _convert(tf, model, b)
        except Exception as exc2:  # noqa: BLE001
            raise UnsupportedError(f"{Path(str(whole_model.path)).name}: TensorFlow Lite's converter cannot lower "
                                   f"this model to built-in ops: {_first_error(exc2)}; {WAY_OUT}") from None
    content, clips = unclipped(content)
    Path(path).write_bytes(content)
    ops = ops_of(content)
    fused = sum(op in FUSED for op in ops)
    loops = ops.count("WHILE")
    ins = ", ".join(f"'{t.name.split(':')[0]}' ({'int32 token ids' if t.dtype.is_integer else 'float32'})"
                    for t in model.inputs)
    lines = [f"signature '{SIGNATURE}', inputs {ins}; {fused} fused LSTM op(s)"
             + (f" (the converter's cell_clip=10 removed from {clips}: Keras does not clip the cell state)"
                if clips else "")
             + f", {loops} WHILE loop(s) (GRU, SimpleRNN, masked or hard_sigmoid LSTMs); "
             + ("batch and time free" if fixed is None else
                f"batch fixed at {fixed} (TF's converter fuses an LSTM and lowers a WHILE loop at a fixed batch "
                "only; write option batch=N), time free"),
             "run: it = tf.lite.Interpreter(model_path=...); r = it.get_signature_runner(); "
             "r(**{input name: array})['output_0']; it.reset_all_variables() between sequences (a fused LSTM op "
             "keeps its state in variable tensors)"]
    return lines
