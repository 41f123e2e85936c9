"""Keras 2 / tf.keras / tf_keras full-model configs translated into configs Keras 3 builds (issue #17).

A Keras 2 full-model HDF5 file holds the model's architecture as JSON (root attribute ``model_config``)
and the weights of every layer (group ``model_weights/<layer>``, datasets listed by ``@weight_names``;
tf_keras ``saving/legacy/hdf5_format.py``). Keras 3 cannot build most of those configs itself: unknown
classes (``CuDNNLSTM``), keyword arguments it no longer takes (``time_major``, ``implementation``,
``input_length``, a layer's ``batch_input_shape``), and a redefined ``hard_sigmoid``. This module
rewrites the config, layer by layer, into the Keras 3 serialization form (``{"module", "class_name",
"config", "registered_name"}``), without importing any Keras:

* a whitelist of layer classes (:data:`LAYERS`): anything else (``Lambda``, custom layers, ...) is
  refused by name, so no code is ever deserialized;
* every config key either kept (Keras 3 takes it: the caller passes ``accepted(class) -> set``), dropped
  when it cannot change what the trained model computes (:data:`INERT_KEYS`: ``time_major=False``,
  ``implementation``, ``input_length``, initializers; each drop named in the notes), or refused by name;
* activations kept only where Keras 2 and Keras 3 define the same function (:data:`SAME_ACTIVATIONS`);
  Keras 2's ``hard_sigmoid`` is kept as Keras 3's ``hard_sigmoid`` *and the weights feeding it are
  scaled by 1.2* where the pre-activation is linear in the layer's own weights (:data:`HARD_SIGMOID_SCALE`,
  :class:`Rescale`), refused elsewhere;
* ``CuDNNLSTM`` -> ``LSTM`` (tanh / sigmoid), ``CuDNNGRU`` -> ``GRU(reset_after=True)`` (tanh / sigmoid):
  cuDNN's fixed activations (tf_keras ``layers/rnn/cudnn_lstm.py``, ``cudnn_gru.py``); no dropout there.

The hard_sigmoid identity: Keras 2 (tf_keras ``backend.hard_sigmoid``) computes ``clip(0.2 x + 0.5, 0, 1)``;
Keras 3.15 (``keras/src/backend/tensorflow/nn.py``: ``relu6(x + 3) / 6``; torch: ``hardsigmoid``)
computes ``clip(x / 6 + 0.5, 0, 1)``. So Keras-2's function at ``x`` is Keras-3's at ``1.2 x``. A gate's
pre-activation ``W x + U h + b`` (GRU reset-after: ``W x + b_i + r * (U h + b_h)`` for the candidate; the
r and z gates are plain sums) is linear in that gate's own columns of ``W``, ``U`` and ``b`` (both bias
rows of a reset-after GRU), with the state ``h`` unchanged because the gate's *value* is unchanged; so
scaling exactly those columns by 1.2 makes Keras 3 compute Keras 2's layer. Checked numerically against
tf_keras in ``tests/formats/whole_models/test_keras_whole.py``. Rounding added: one float32 multiplication per rescaled
weight (``float32(float64(w) * 1.2)``, within half an ulp of ``1.2 w`` plus 2**-53 relative), and Keras 3
then computes ``x'/6`` where Keras 2 computed ``0.2 x``: "rescaled, not bit-exact".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import UnsupportedError, WholeModelError, require
from ...conventions import keras_names as naming

#: the way out of a whole-model refusal (API words, CLI words)
WAY_OUT = ("convert the recurrent layers alone: write option recurrent_only=True (a .keras of the recurrent "
           "layers), or another target (.onnx, .pt)")
WAY_OUT_CLI = ("convert the recurrent layers alone: --recurrent-only (a .keras of the recurrent layers), "
               "or --to onnx / .pt")

#: Keras 2 class -> Keras 3 class (CuDNN layers and the Keras 2 ``Model`` name translated).
LAYERS = {c: c for c in (
    "InputLayer", "Dense", "Embedding", "Conv1D", "Dropout", "SpatialDropout1D", "GaussianNoise",
    "GaussianDropout", "AlphaDropout", "Masking", "Activation", "Flatten", "Reshape", "Permute", "RepeatVector",
    "Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "BatchNormalization",
    "LayerNormalization", "MaxPooling1D", "AveragePooling1D", "GlobalMaxPooling1D", "GlobalAveragePooling1D",
    "ZeroPadding1D", "Cropping1D", "UpSampling1D", "LSTM", "GRU", "SimpleRNN", "Bidirectional",
    "TimeDistributed", "Sequential", "Functional", "ReLU", "LeakyReLU", "ELU", "Softmax",
    # identity at inference (an activity penalty; random augmentations drawn in training only)
    "ActivityRegularization", "Identity", "SpatialDropout2D", "SpatialDropout3D", "RandomFlip", "RandomRotation",
    "RandomZoom", "RandomTranslation", "RandomContrast", "RandomBrightness",
    # the same function in both (checked layer by layer against tf_keras: tests/formats/whole_models/test_keras_whole_layers.py)
    "PReLU", "UnitNormalization", "GroupNormalization", "Rescaling", "EinsumDense", "Conv1DTranspose",
    "SeparableConv1D", "DepthwiseConv1D", "Conv2D", "Conv2DTranspose", "SeparableConv2D", "DepthwiseConv2D",
    "Conv3D", "Conv3DTranspose", "MaxPooling2D", "AveragePooling2D", "GlobalMaxPooling2D",
    "GlobalAveragePooling2D", "ZeroPadding2D", "Cropping2D", "UpSampling2D", "MaxPooling3D", "AveragePooling3D",
    "GlobalMaxPooling3D", "GlobalAveragePooling3D", "ZeroPadding3D", "Cropping3D", "UpSampling3D")}
LAYERS.update({"Model": "Functional", **naming.CUDNN_TWIN, **naming.CLASS_ALIASES})
#: Keras 3 built-ins that Keras 2 also has, not translated, and why (said in the refusal)
NOT_TRANSLATED = {
    "Lambda": "a Lambda layer's function is Python code, which is never deserialized",
    "ConvLSTM1D": "a convolutional LSTM is not read as a recurrent layer here (its gates, Keras 2's default "
                  "hard_sigmoid among them, are not translated)",
    "Attention": "the attention layers are not checked against tf_keras yet",
    "AdditiveAttention": "the attention layers are not checked against tf_keras yet",
    "MultiHeadAttention": "the attention layers are not checked against tf_keras yet",
    "Dot": "not checked against tf_keras yet",
    "SpectralNormalization": "its kernel is renormalized by a stored power-iteration state; not checked",
    "RNN": "a generic RNN wrapper of a cell: not translated (LSTM / GRU / SimpleRNN layers are)",
    "StackedRNNCells": "stacked cells in one RNN layer: not translated",
    "Normalization": "a preprocessing layer with adapted state: not checked",
    "Discretization": "a preprocessing layer with adapted state: not checked",
    "CategoryEncoding": "a preprocessing layer: not checked",
    "Hashing": "a preprocessing layer (hash function): not checked",
    "HashedCrossing": "a preprocessing layer (hash function): not checked",
    "IntegerLookup": "a lookup layer with a vocabulary asset: not translated",
    "StringLookup": "a lookup layer with a vocabulary asset: not translated",
    "TextVectorization": "a text layer with a vocabulary asset: not translated",
    "Resizing": "image resizing (interpolation implementations differ): not checked",
    "CenterCrop": "image cropping with resizing: not checked",
    "RandomCrop": "not the identity at inference (a center crop and resize): not checked",
}
NOT_TRANSLATED.update({c: NOT_TRANSLATED["ConvLSTM1D"] for c in ("ConvLSTM2D", "ConvLSTM3D")})
NOT_TRANSLATED.update({c: "Keras 3 has no such layer" for c in (
    "ThresholdedReLU", "LocallyConnected1D", "LocallyConnected2D", "DenseFeatures", "RandomHeight", "RandomWidth")})
RECURRENT = set(naming.KERAS_CLASS.values())

#: Activations both Keras 2 and Keras 3 define as the same function under the same name.
SAME_ACTIVATIONS = {"linear", "relu", "sigmoid", "tanh", "softmax", "softplus", "softsign", "elu", "selu",
                    "exponential"}
#: Keras-2 hard_sigmoid(x) = Keras-3 hard_sigmoid(HARD_SIGMOID_SCALE * x) (see the module docstring).
HARD_SIGMOID_SCALE = 1.2

#: keys Keras 3 no longer takes that cannot change what a trained model computes: key -> test of the
#: value (``None``: any value). ``time_major=True`` would change the input layout: refused.
INERT_KEYS: dict[str, Callable[[Any], bool] | None] = {
    "time_major": lambda v: v is False,
    "implementation": None,  # LSTM/GRU kernel choice (tf_keras: 1 or 2, same function)
    "input_length": None,  # Embedding: a shape hint
    "ragged": lambda v: v is False,
    "batch_input_shape": None,  # moved into an InputLayer where it matters
    "input_dtype": None,
    "build_config": None,
    "trainable": None,  # only where Keras 3 does not take it (SpatialDropout1D): no effect at inference
    "noise_shape": lambda v: v is None,  # SpatialDropout: Keras 3 derives it, as Keras 2 did when None
    "groups": lambda v: v == 1,  # Conv*Transpose / SeparableConv / DepthwiseConv: Keras 3 has one group only
    "rng_type": None,  # random augmentation layers (identity at inference): which generator draws in training
}
#: Keras 2 key -> the Keras 3 key of the same meaning, per class
RENAMED_KEYS = {("LeakyReLU", "alpha"): "negative_slope"}
#: layers whose pre-activation is linear in all their weights (kernel(s) applied once, bias): a Keras-2
#: hard_sigmoid activation is rescaled on every weight (:class:`Rescale` ``all``); SimpleRNN: see the docstring
LINEAR_ALL = ("Dense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
              "DepthwiseConv1D", "DepthwiseConv2D", "EinsumDense", "SimpleRNN")
#: integer dtypes a Keras 2 layer config may carry: the dtype of the input its batch_input_shape makes
INPUT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_INIT_SUFFIX = "_initializer"
_INPUT_DTYPE = "dtype (input)"
_REG_CLASSES = {"L1L2", "L1", "L2", "OrthogonalRegularizer"}
_CONSTRAINT_CLASSES = {"MaxNorm", "NonNeg", "UnitNorm", "MinMaxNorm"}


@dataclass
class Rescale:
    """Which weights of a layer get scaled by :data:`HARD_SIGMOID_SCALE` (Keras-2 hard_sigmoid).

    ``gates``: for LSTM/GRU, the Keras gate blocks (LSTM ``i f c o`` = 0 1 2 3, GRU ``z r h`` = 0 1 2) whose
    kernel / recurrent-kernel columns and bias entries are scaled; ``all``: every weight of a
    layer of :data:`LINEAR_ALL` (kernel, recurrent kernel, bias).
    """

    path: str
    cls: str
    gates: tuple[int, ...] = ()
    all: bool = False


@dataclass
class Translation:
    """The Keras 3 model config and what the translation did (see :func:`translate`)."""

    config: dict[str, Any]
    rescale: dict[str, Rescale] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: dotted layer path -> Keras 3 class, for every layer (nested containers joined with ``.``)
    classes: dict[str, str] = field(default_factory=dict)
    #: dotted path -> source class (``CuDNNLSTM`` ...)
    source_classes: dict[str, str] = field(default_factory=dict)


class _Ctx:
    def __init__(self, accepted: Callable[[str], set[str] | None]):
        self.accepted = accepted
        self.tr = Translation({})
        self.dropped: dict[str, set[str]] = {}

    def refuse(self, path: str, cls: str, why: str) -> None:
        head = f"layer '{path}' ({cls}) cannot be written as a whole Keras 3 model: {why}; "
        raise WholeModelError(head + WAY_OUT, cli=head + WAY_OUT_CLI, layer=path, layer_class=cls, reason=head[:-2])

    def drop(self, key: str, path: str) -> None:
        self.dropped.setdefault(key, set()).add(path)


def layer_records(cfg: Any) -> list[dict]:
    """The layer records of a Sequential/Functional config (Keras <= 2.1 Sequential: a bare list)."""
    inner = cfg.get("config") if isinstance(cfg, dict) else None
    layers = inner if isinstance(inner, list) else (inner or {}).get("layers") if isinstance(inner, dict) else None
    if not isinstance(layers, list) or not all(isinstance(r, dict) for r in layers):
        raise UnsupportedError("model_config is not a Sequential/Functional model with a list of layers")
    return layers


def translate(model_config: dict[str, Any], accepted: Callable[[str], set[str] | None]) -> Translation:
    """Translate a Keras 2 ``model_config`` (parsed JSON) into a Keras 3 model config.

    Args:
        model_config: ``{"class_name": "Sequential"|"Functional"|"Model", "config": ...}``.
        accepted: ``accepted(keras3_class)`` -> the constructor keywords Keras 3 takes for that class
            (``None``: take every key); supplied by the caller, which has Keras 3 imported.

    Returns:
        a :class:`Translation`; its ``config`` is ready for ``keras.Model.from_config`` /
        ``keras.Sequential.from_config`` (via ``keras.saving.deserialize_keras_object``).

    Raises:
        UnsupportedError: naming the first layer (dotted path), its class and what Keras 3 cannot express.
    """
    ctx = _Ctx(accepted)
    ctx.tr.config = _model(ctx, model_config, "")
    for key, paths in sorted(ctx.dropped.items()):
        what = ("initializers (they only seed training from scratch; every weight is set from the file)"
                if key == _INIT_SUFFIX else
                "an integer 'dtype' (in Keras 2 the dtype of the model input, carried by the InputLayer; "
                "the layer's weights stay float)" if key == _INPUT_DTYPE
                else f"'{key}' (no effect on a trained model's outputs)")
        ctx.tr.notes.append(f"dropped {what} from {len(paths)} layer config(s): {', '.join(sorted(paths)[:6])}"
                            f"{' ...' if len(paths) > 6 else ''}")
    return ctx.tr


def _model(ctx: _Ctx, rec: dict, prefix: str) -> dict:
    cls = rec.get("class_name")
    name = (rec.get("config") or {}).get("name") if isinstance(rec.get("config"), dict) else None
    if cls not in ("Sequential", "Functional", "Model"):
        raise UnsupportedError(f"model_config is a {cls!r}, not a Sequential or Functional model")
    records = layer_records(rec)
    out_layers = []
    if cls == "Sequential":
        first = True
        for r in records:
            rc = r.get("config") if isinstance(r.get("config"), dict) else {}
            if first and r.get("class_name") != "InputLayer" and rc.get("batch_input_shape") is not None:
                # Keras 2 puts the model's input shape on its first layer; Keras 3 wants an InputLayer
                out_layers.append(_wrap("InputLayer", {
                    "batch_shape": rc["batch_input_shape"], "dtype": rc.get("dtype", "float32")
                    if isinstance(rc.get("dtype"), str) else "float32", "name": f"{rc.get('name', 'input')}_input"}))
            first = False
            out_layers.append(_layer(ctx, r, prefix))
        conf = {"name": name or "sequential", "trainable": True, "layers": out_layers}
        return _wrap("Sequential", conf, module="keras")
    conf_in = rec["config"]
    # a nested Sequential that knows its input has a built-in node 0 in tf_keras (calls count from 1),
    # none in Keras 3 (calls count from 0); nested Functional models have one in both
    shifted = {r["config"]["name"] for r in records if r.get("class_name") == "Sequential"
               and isinstance(r.get("config"), dict) and _has_input(r)}
    for r in records:
        lay = _layer(ctx, r, prefix)
        lay["name"] = lay["config"]["name"]
        lay["inbound_nodes"] = _nodes(ctx, r, prefix, shifted)
        out_layers.append(lay)
    conf = {"name": name or "model", "trainable": True, "layers": out_layers,
            "input_layers": conf_in.get("input_layers"), "output_layers": conf_in.get("output_layers")}
    return {"module": "keras.src.models.functional", "class_name": "Functional", "config": conf,
            "registered_name": "Functional"}


def _has_input(r: dict) -> bool:
    try:
        recs = layer_records(r)
    except UnsupportedError:
        return False
    return bool(recs) and (recs[0].get("class_name") == "InputLayer"
                           or (recs[0].get("config") or {}).get("batch_input_shape") is not None)


def _nodes(ctx: _Ctx, r: dict, prefix: str, shifted: set[str]) -> list:
    nodes = copy.deepcopy(r.get("inbound_nodes") or [])
    path = prefix + str((r.get("config") or {}).get("name"))
    for node in nodes:
        if not isinstance(node, list):
            ctx.refuse(path, str(r.get("class_name")), "its inbound nodes are not in the Keras 2 list form")
        for inp in node:
            if not (isinstance(inp, list) and len(inp) >= 3 and isinstance(inp[1], int)):
                ctx.refuse(path, str(r.get("class_name")), f"inbound node entry {inp!r} is not [layer, node, tensor]")
            kw = inp[3] if len(inp) > 3 else {}
            if not isinstance(kw, dict) or any(isinstance(v, (list, dict)) for v in kw.values()):
                ctx.refuse(path, str(r.get("class_name")), f"it is called with tensor keyword arguments {kw!r} "
                           "(e.g. initial_state), which this translation does not carry")
            if inp[0] in shifted:
                inp[1] -= 1
    return nodes


def _wrap(cls: str, conf: dict, module: str = "keras.layers") -> dict:
    return {"module": module, "class_name": cls, "config": conf, "registered_name": None}


def _layer(ctx: _Ctx, r: dict, prefix: str) -> dict:
    src_cls = r.get("class_name")
    conf = r.get("config")
    if not isinstance(src_cls, str) or not isinstance(conf, dict) or not isinstance(conf.get("name"), str):
        raise UnsupportedError(f"a layer record under '{prefix or 'the model'}' has no class name or name")
    path = prefix + conf["name"]
    cls = LAYERS.get(src_cls)
    if cls is None:
        ctx.refuse(path, src_cls, NOT_TRANSLATED.get(src_cls) or "Keras 3 has no built-in layer of that class that "
                   "computes the same function (custom and Lambda layers are never deserialized)")
    ctx.tr.classes[path] = cls
    ctx.tr.source_classes[path] = src_cls
    if cls in ("Sequential", "Functional"):
        return _model(ctx, {"class_name": src_cls, "config": conf}, path + ".")
    conf = dict(conf)
    if src_cls.startswith("CuDNN"):
        conf.update(activation="tanh", recurrent_activation="sigmoid")
        if cls == "GRU":
            conf["reset_after"] = True
        ctx.tr.notes.append(f"{path}: {src_cls} becomes Keras 3 {cls}"
                            f"{'(reset_after=True)' if cls == 'GRU' else ''} with cuDNN's activations "
                            "(tanh, gates sigmoid); it runs on CPU and GPU")
    if cls == "GRU" and "reset_after" not in conf:
        conf["reset_after"] = False  # Keras 2.0/2.1 configs predate the key: reset-before (LAYOUTS.md §3.4)
    if cls in ("Bidirectional", "TimeDistributed"):
        inner = conf.get("layer")
        if not isinstance(inner, dict):
            ctx.refuse(path, src_cls, "its wrapped layer has no config")
        sub = _layer(ctx, inner, path + "/")
        if cls == "TimeDistributed" and sub["class_name"] in RECURRENT | {"Bidirectional"}:
            ctx.refuse(path, src_cls, "a recurrent layer inside TimeDistributed is not translated")
        if cls == "Bidirectional" and sub["class_name"] not in RECURRENT:
            ctx.refuse(path, src_cls, f"it wraps a {sub['class_name']}, not a recurrent layer")
        conf["layer"] = sub
        if conf.get("backward_layer") is not None:
            conf["backward_layer"] = _layer(ctx, conf["backward_layer"], path + "/backward:")
        if path + "/" + sub["config"]["name"] in ctx.tr.rescale:  # the inner layer's rescale is the wrapper's
            ctx.tr.rescale[path] = ctx.tr.rescale.pop(path + "/" + sub["config"]["name"])
            ctx.tr.rescale[path].path = path
        bw = conf.get("backward_layer")
        if isinstance(bw, dict):
            ctx.tr.rescale.pop(path + "/backward:" + bw["config"]["name"], None)
    _activations(ctx, path, src_cls, cls, conf)
    return _wrap(cls, _keys(ctx, path, src_cls, cls, conf))


def _activations(ctx: _Ctx, path: str, src_cls: str, cls: str, conf: dict) -> None:
    gates: list[int] = []
    for key in ("activation", "recurrent_activation"):
        if key not in conf:
            continue
        a = conf[key]
        if a is None:
            conf[key] = "linear"
            continue
        if not isinstance(a, str):
            ctx.refuse(path, src_cls, f"{key}={a!r} is not a built-in activation name")
        if a in SAME_ACTIVATIONS:
            continue
        if a != "hard_sigmoid":
            ctx.refuse(path, src_cls, f"{key}='{a}' has no Keras 3 built-in with the same definition")
        # Keras-2 hard_sigmoid: exact up to rounding where its input is linear in this layer's own weights
        if cls == "LSTM" and key == "recurrent_activation":
            gates += [0, 1, 3]
        elif cls == "GRU":
            gates += [0, 1] if key == "recurrent_activation" else [2]
        elif cls in LINEAR_ALL and key == "activation":
            ctx.tr.rescale[path] = Rescale(path, cls, all=True)
        else:
            why = ("an LSTM's activation also squashes the cell state, which no weight scaling reaches"
                   if cls == "LSTM" else "its input is not computed from weights of this layer alone")
            ctx.refuse(path, src_cls, f"{key}='hard_sigmoid' in Keras 2's definition clip(0.2x+0.5, 0, 1) "
                       f"(Keras 3's hard_sigmoid is clip(x/6+0.5, 0, 1)) and {why}")
    if gates:
        ctx.tr.rescale[path] = Rescale(path, cls, gates=tuple(sorted(gates)))


def _keys(ctx: _Ctx, path: str, src_cls: str, cls: str, conf: dict) -> dict:
    ok = ctx.accepted(cls)
    out = {}
    dtype = conf.get("dtype")
    if cls != "InputLayer" and dtype in INPUT_DTYPES and conf.get("batch_input_shape") is not None:
        # Keras 2.0/2.1: an integer dtype on a layer is the dtype of the model input made from its
        # batch_input_shape (the InputLayer above carries it); its weights are float (Keras 2.0 add_weight
        # defaults to floatx). As a Keras 3 layer dtype it would make the weights integers (an Embedding's
        # RandomUniform(-0.05, 0.05) initializer then fails: "Need minval < maxval, got 0 >= 0").
        conf = {k: v for k, v in conf.items() if k != "dtype"}
        ctx.drop(_INPUT_DTYPE, path)
        dtype = None
    if dtype is not None and not (isinstance(dtype, str) and dtype in ("float32", "float64", "float16", "int32")):
        if not (isinstance(dtype, dict) and (dtype.get("config") or {}).get("name") == "float32"):
            ctx.refuse(path, src_cls, f"dtype {dtype!r} (mixed precision policies are not translated)")
        conf["dtype"] = "float32"
    if cls == "InputLayer":
        conf = dict(conf)
        if "batch_input_shape" in conf:
            conf["batch_shape"] = conf.pop("batch_input_shape")
        if conf.get("sparse") or conf.get("ragged"):
            ctx.refuse(path, src_cls, "sparse or ragged inputs")
    if cls == "BatchNormalization" and isinstance(conf.get("axis"), list):  # tf_keras writes [axis]
        if len(conf["axis"]) != 1 or not isinstance(conf["axis"][0], int):
            ctx.refuse(path, src_cls, f"axis={conf['axis']!r}: Keras 3 normalizes over one axis only")
        conf = {**conf, "axis": conf["axis"][0]}
    for key, val in list(conf.items()):
        new_key = RENAMED_KEYS.get((cls, key))
        if new_key is not None and new_key not in conf and (ok is None or new_key in ok):
            key = new_key
        if key.endswith(_INIT_SUFFIX):
            ctx.drop(_INIT_SUFFIX, path)
            continue
        if key.endswith(("_regularizer", "_constraint")) and val is not None:
            val = _reg_or_constraint(ctx, path, src_cls, key, val)
        if ok is None or key in ok:
            out[key] = val
            continue
        test = INERT_KEYS.get(key, False)
        if test is None or (test is not False and test(val)):
            if key != "batch_input_shape":
                ctx.drop(key, path)
            continue
        if key in ("recurrent_dropout", "dropout") and not val:
            continue
        if key.endswith(("_regularizer", "_constraint")) and val is None:  # e.g. SeparableConv's unused kernel_*
            continue
        ctx.refuse(path, src_cls, f"config key {key}={val!r} has no Keras 3 equivalent")
    return out


def _reg_or_constraint(ctx: _Ctx, path: str, src_cls: str, key: str, val: Any) -> dict:
    reg = key.endswith("_regularizer")
    allowed = _REG_CLASSES if reg else _CONSTRAINT_CLASSES
    if not isinstance(val, dict) or val.get("class_name") not in allowed or not isinstance(val.get("config"), dict):
        ctx.refuse(path, src_cls, f"{key}={val!r} is not a built-in Keras 3 {'regularizer' if reg else 'constraint'}")
    return {"module": "keras.regularizers" if reg else "keras.constraints", "class_name": val["class_name"],
            "config": dict(val["config"]), "registered_name": None}


def import_keras3():
    """Import Keras 3 (``import keras``; not tf_keras); raises DependencyError when missing and
    UnsupportedError when ``import keras`` gives Keras 2."""
    k = require("keras", "tensorflow")
    if not str(getattr(k, "__version__", "0")).startswith("3"):
        raise UnsupportedError(f"'import keras' gives Keras {k.__version__}; the keras3 format needs Keras 3")
    return k


def keras3_keywords(k):
    """``accepted(keras3_class) -> set`` for :func:`translate`: the constructor keywords Keras 3 (the module ``k``)
    takes for that class, read from its ``__init__`` signatures up the MRO while they pass on ``**kwargs``."""
    import inspect as pyinspect

    cache: dict[str, set[str] | None] = {}
    base = {"name", "dtype", "trainable", "autocast", "activity_regularizer", "input_shape", "input_dim"}

    def accepted(cls: str) -> set[str] | None:
        if cls not in cache:
            klass = getattr(k.layers, cls, None)
            if klass is None:
                cache[cls] = set()
            else:  # the keywords of each __init__ up the MRO while they pass on **kwargs
                keys: set[str] = set()
                for c in klass.__mro__:
                    if "__init__" not in vars(c):
                        continue
                    params = pyinspect.signature(vars(c)["__init__"]).parameters
                    keys |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
                    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                        break  # e.g. SpatialDropout1D(rate, seed, name, dtype): no trainable, no noise_shape
                else:
                    keys |= base
                cache[cls] = keys
        return cache[cls]
    return accepted
