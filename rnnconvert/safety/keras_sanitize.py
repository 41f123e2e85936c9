"""Keras model configs rebuilt from rnnconvert's own whitelist before any Keras sees them (issue #40, HIGH 1).

A Keras config is untrusted input: tf_keras deserializes any config value that carries
``__passive_serialization__`` (or a ``class_name``/``config`` pair in an initializer, regularizer or
constraint slot) against its registry, and a ``Lambda`` found there carries marshalled Python bytecode that
``Layer.__call__`` runs (an ``activity_regularizer`` is called on every output). Whitelisting layer classes
and activation names is not enough: every value of every config must be data rnnconvert understands.

:func:`model_config` rebuilds a whole model config (Keras 1/2 ``model_config`` of an HDF5 file, a tf.keras
SavedModel's ``keras_metadata.pb`` config, a Keras 3 ``config.json``) and :func:`layer_config` one layer's
config, from scratch, key by key in the stored order (so that a legitimate config comes out equal to the one
read, and every writer's output stays byte for byte the same):

* layer classes: :data:`LAYER_CLASSES` (the union of the whole-model writers' and the Keras 3 translation's
  whitelists, :mod:`rnnconvert.conventions.full_model` and :mod:`rnnconvert.formats.keras.keras_config`, and
  the containers); another class is refused by name (``unknown='refuse'``) or kept as a stub holding its name
  only (``unknown='stub'``: the readers, so that the writers' own refusals, which name the class and give the
  way out, still speak);
* config keys: :data:`KEYS` (key -> a typed check: bounded integers, finite floats in range, strings of
  :data:`MAX_NAME` or :data:`MAX_STR` characters from a fixed set where the set is known, shapes of at most
  :data:`MAX_RANK` entries, lists at most 3 deep and :data:`MAX_LIST` long); an unknown key is refused naming
  the layer and the key;
* initializers (``*_initializer``, Keras 1 ``init``/``inner_init``): rebuilt from :data:`INITIALIZERS` (class
  -> its config keys, typed), or dropped when outside it (weights are always set by rnnconvert, so an
  initializer never reaches an output value); regularizers and constraints: rebuilt from
  :data:`REGULARIZERS` / :data:`CONSTRAINTS`, refused otherwise; dtype policies rebuilt from
  :data:`DTYPES`; never a ``__passive_serialization__``, ``function``, ``module`` or ``registered_name``
  outside :data:`MODULES` / the class's own name.

Errors: an unknown class (``unknown='refuse'``), key, initializer-free slot class (a ``Lambda`` as a
regularizer) -> :class:`~rnnconvert.errors.UnsupportedError` (exit 4); a value of the wrong type or out of
range (``Infinity`` in a shape, a rate of ``10**400``, a name of 100,000 characters) ->
:class:`~rnnconvert.errors.FormatError` (exit 3); both one line naming the file, the layer and the key.

The tables come from the configs tf_keras 2.21 and Keras 3.15 write for every whitelisted class (``get_config``)
and from the fixtures of ``fixtures/`` (Keras 2.0.2 to Keras 3.15 files); :func:`is_sanitized` is the fixed point
test the security tests apply to every dict that reaches a Keras deserialization entry point.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import FormatError, UnsupportedError

#: longest layer / model / tensor name kept (Keras' own names are a few dozen characters)
MAX_NAME = 256
#: longest other string value (padding modes, dtype names, einsum equations ...)
MAX_STR = 64
#: most entries in a shape
MAX_RANK = 16
#: most entries in any other list (inbound nodes of a layer, axes ...)
MAX_LIST = 4096
#: most layer records in one model (nested models included)
MAX_LAYERS = 100_000
#: deepest nesting of models / wrappers
MAX_DEPTH = 32
#: largest integer size (units, filters, input_dim, a shape entry ...)
MAX_INT = 2**31 - 1
#: largest magnitude of a float setting (epsilon, alpha, l2, mask_value ...)
MAX_FLOAT = 1e30

#: what a refusal ends with
WAY_OUT = "--recurrent-only converts the recurrent layers alone"
WAY_OUT_API = "write option recurrent_only=True converts the recurrent layers alone"

CONTAINERS = ("Sequential", "Functional", "Model")
#: every layer class a whole-model route builds (keras_graph.LAYERS | keras_config.LAYERS), Keras 3's mask ops
LAYER_CLASSES = frozenset({
    "InputLayer", "Dense", "Embedding", "Conv1D", "Dropout", "SpatialDropout1D", "GaussianNoise", "GaussianDropout",
    "AlphaDropout", "Masking", "Activation", "Flatten", "Reshape", "Permute", "RepeatVector", "Concatenate", "Add",
    "Subtract", "Multiply", "Average", "Maximum", "Minimum", "BatchNormalization", "LayerNormalization",
    "MaxPooling1D", "AveragePooling1D", "GlobalMaxPooling1D", "GlobalAveragePooling1D", "ZeroPadding1D",
    "Cropping1D", "UpSampling1D", "LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU", "Bidirectional",
    "TimeDistributed", "ReLU", "LeakyReLU", "ELU", "Softmax", "ActivityRegularization", "Identity",
    "SpatialDropout2D", "SpatialDropout3D", "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation",
    "RandomContrast", "RandomBrightness", "PReLU", "UnitNormalization", "GroupNormalization", "Rescaling",
    "EinsumDense", "Conv1DTranspose", "SeparableConv1D", "DepthwiseConv1D", "Conv2D", "Conv2DTranspose",
    "SeparableConv2D", "DepthwiseConv2D", "Conv3D", "Conv3DTranspose", "MaxPooling2D", "AveragePooling2D",
    "GlobalMaxPooling2D", "GlobalAveragePooling2D", "ZeroPadding2D", "Cropping2D", "UpSampling2D", "MaxPooling3D",
    "AveragePooling3D", "GlobalMaxPooling3D", "GlobalAveragePooling3D", "ZeroPadding3D", "Cropping3D",
    "UpSampling3D", "NotEqual", "Any", "Attention", "AdditiveAttention", "MultiHeadAttention",
    # Keras 2 aliases (conventions.keras_names.CLASS_ALIASES)
    "Convolution1D", "Convolution2D", "MaxPool1D", "MaxPool2D", "AvgPool1D", "AvgPool2D", "GlobalMaxPool1D",
    "GlobalAvgPool1D", "GlobalMaxPool2D", "GlobalAvgPool2D", "Conv1DTranspose"})
#: the ``module`` values a Keras 3 record may carry
MODULES = frozenset({"keras", "keras.layers", "keras.initializers", "keras.regularizers", "keras.constraints",
                     "keras.src.models.functional", "keras.src.models.sequential", "keras.models",
                     "keras.src.ops.numpy", "keras.src.ops.core"})
#: dtype names (a layer's ``dtype`` string, a dtype policy's ``name``)
DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
                    "uint16", "uint32", "uint64", "bool", "string", "mixed_float16", "mixed_bfloat16"})
#: built-in activation names (the writers then refuse those they do not build, by name)
ACTIVATIONS = frozenset({"linear", "relu", "sigmoid", "tanh", "softmax", "softplus", "softsign", "elu", "selu",
                         "exponential", "hard_sigmoid", "hard_sigmoid_k3", "swish", "silu", "gelu", "relu6",
                         "leaky_relu", "log_softmax", "mish", "hard_silu", "hard_swish", "celu", "glu",
                         "sparse_plus", "squareplus", "soft_shrink", "hard_shrink", "tanh_shrink", "hard_tanh",
                         "log_sigmoid", "sparsemax", "threshold"})
#: Keras 1/2 initializer names given as strings
INIT_NAMES = frozenset({"zeros", "ones", "zero", "one", "glorot_uniform", "glorot_normal", "he_uniform",
                        "he_normal", "lecun_uniform", "lecun_normal", "orthogonal", "identity", "uniform",
                        "normal", "random_uniform", "random_normal", "truncated_normal", "constant",
                        "variance_scaling"})


class _Bad(Exception):
    """A value that fails its check (``unsupported``: refused as a feature, else malformed)."""

    def __init__(self, why: str, unsupported: bool = False):
        super().__init__(why)
        self.unsupported = unsupported


_DROP = object()


def _show(s: Any, n: int = 48) -> str:
    """A bounded, one-line rendering of an untrusted key or name."""
    t = s if isinstance(s, str) else type(s).__name__
    t = t.encode("ascii", "backslashreplace").decode("ascii")
    t = "".join(c if c.isprintable() else "?" for c in t)
    return t[:n] + ("..." if len(t) > n else "")


# ----------------------------------------------------------------------------- value checks

def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"{_show(v)} is not true/false")
    return v


def _int(lo: int = 0, hi: int = MAX_INT) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _Bad(f"{_num_show(v)} is not an integer in [{lo}, {hi}]")
        return v
    return check


def _num_show(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"a {type(v).__name__}"
    if isinstance(v, int) and abs(v) > 10**12:
        return "an integer of %d digits" % len(str(abs(v))) if abs(v) < 10**4000 else "a huge integer"
    return repr(v)


def _num(lo: float = -MAX_FLOAT, hi: float = MAX_FLOAT) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(f"{_num_show(v)} is not a number")
        if isinstance(v, int) and not lo <= v <= hi:
            raise _Bad(f"{_num_show(v)} is outside [{lo:g}, {hi:g}]")
        if isinstance(v, float) and (not math.isfinite(v) or not lo <= v <= hi):
            raise _Bad(f"{v!r} is not a finite number in [{lo:g}, {hi:g}]")
        return v
    return check


def _str(n: int = MAX_STR, choices: frozenset | None = None) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str):
            raise _Bad(f"a {type(v).__name__} where a string was expected")
        if len(v) > n:
            raise _Bad(f"a string of {len(v)} characters (at most {n})")
        if choices is not None and v not in choices:
            raise _Bad(f"'{_show(v)}' is not one of the names rnnconvert knows", unsupported=True)
        return v
    return check


def _opt(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else check(v)


def _either(*checks: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        last: _Bad | None = None
        for c in checks:
            try:
                return c(v)
            except _Bad as exc:
                last = exc
        raise last if last is not None else _Bad("no check")
    return check


def _plain(depth: int = 3, n: int = MAX_LIST) -> Callable[[Any], Any]:
    """JSON data without objects: None, true/false, a bounded integer, a finite float, a short string, or a list
    of those at most ``depth`` deep and ``n`` long (shapes, axes, strides, paddings, call keywords)."""
    scalar = _either(_bool, _int(-MAX_INT, MAX_INT), _num(), _str(MAX_NAME))

    def check(v: Any, d: int = depth) -> Any:
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            if d <= 0 or len(v) > n:
                raise _Bad(f"a list {'nested too deeply' if d <= 0 else f'of {len(v)} entries'}")
            return [check(x, d - 1) for x in v]
        if isinstance(v, dict):
            raise _Bad("an object where plain data was expected", unsupported=True)
        return scalar(v)
    return check


def _shape(v: Any) -> list:
    """A shape: a list of at most :data:`MAX_RANK` entries, each None or an integer in [0, MAX_INT]."""
    if not isinstance(v, (list, tuple)) or len(v) > MAX_RANK:
        raise _Bad("not a shape (a list of at most %d sizes)" % MAX_RANK)
    dim = _opt(_int(0, MAX_INT))
    return [dim(d) for d in v]


def _shapes(v: Any) -> Any:
    """A shape, a list of shapes (multi-input layers) or None."""
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and v and all(isinstance(s, (list, tuple)) or s is None for s in v) \
            and any(isinstance(s, (list, tuple)) for s in v):
        if len(v) > MAX_LIST:
            raise _Bad(f"a list of {len(v)} shapes")
        return [_shapes(s) for s in v]
    return _shape(v)


def _ints(v: Any) -> Any:
    """An integer or a (nested, at most 2 deep) list of integers: kernel sizes, strides, axes, paddings."""
    return _either(_int(-MAX_INT, MAX_INT), lambda x: _plain(2, MAX_RANK)(_only_ints(x)))(v)


def _only_ints(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        for x in v:
            _only_ints(x)
        return v
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise _Bad(f"{_num_show(v)} where an integer was expected")


def _nums(v: Any) -> Any:
    """A finite number or a short list of them (augmentation factors, value ranges)."""
    if isinstance(v, (list, tuple)):
        if len(v) > MAX_RANK:
            raise _Bad(f"a list of {len(v)} numbers")
        return [_num()(x) for x in v]
    return _num()(v)


_NAME = _str(MAX_NAME)
_RATE = _num(0.0, 1.0)
_SEED = _opt(_int(-2**63, 2**64 - 1))
_FLOAT = _num()
_BOOL = _bool
_SIZE = _int(0, MAX_INT)

#: regularizer class -> its config keys (tf_keras 2.21 / Keras 3.15 ``regularizers.py``)
REGULARIZERS: dict[str, dict[str, Callable]] = {
    "L1": {"l1": _num(0.0, MAX_FLOAT)}, "L2": {"l2": _num(0.0, MAX_FLOAT)},
    "L1L2": {"l1": _num(0.0, MAX_FLOAT), "l2": _num(0.0, MAX_FLOAT)},
    "OrthogonalRegularizer": {"factor": _num(0.0, MAX_FLOAT), "mode": _str(choices=frozenset({"rows", "columns"}))}}
#: constraint class -> its config keys (``constraints.py``)
CONSTRAINTS: dict[str, dict[str, Callable]] = {
    "MaxNorm": {"max_value": _FLOAT, "axis": _ints}, "NonNeg": {}, "UnitNorm": {"axis": _ints},
    "MinMaxNorm": {"min_value": _FLOAT, "max_value": _FLOAT, "rate": _FLOAT, "axis": _ints},
    "RadialConstraint": {}}
_VS = {"scale": _FLOAT, "mode": _str(choices=frozenset({"fan_in", "fan_out", "fan_avg"})),
       "distribution": _str(choices=frozenset({"truncated_normal", "untruncated_normal", "uniform", "normal"})),
       "seed": _SEED}
_AXES = {"seed": _SEED, "input_axes": _opt(_ints), "output_axes": _opt(_ints)}
#: initializer class -> its config keys (``initializers``); any other initializer is dropped (weights are set
#: from the file, so an initializer never reaches a value)
INITIALIZERS: dict[str, dict[str, Callable]] = {
    "Zeros": {}, "Ones": {}, "Constant": {"value": _FLOAT},
    "RandomNormal": {"mean": _FLOAT, "stddev": _FLOAT, "seed": _SEED},
    "RandomUniform": {"minval": _FLOAT, "maxval": _FLOAT, "seed": _SEED},
    "TruncatedNormal": {"mean": _FLOAT, "stddev": _FLOAT, "seed": _SEED},
    "VarianceScaling": dict(_VS, **_AXES), "GlorotUniform": _AXES, "GlorotNormal": _AXES, "HeUniform": _AXES,
    "HeNormal": _AXES, "LecunUniform": _AXES, "LecunNormal": _AXES,
    "Orthogonal": {"gain": _FLOAT, "seed": _SEED}, "Identity": {"gain": _FLOAT}}


def _policy(v: Any) -> Any:
    """A dtype: a name of :data:`DTYPES`, or a dtype policy object rebuilt (``Policy`` / ``DTypePolicy``)."""
    if v is None or isinstance(v, str):
        return _opt(_str(choices=DTYPES))(v)
    if not isinstance(v, dict) or v.get("class_name") not in ("Policy", "DTypePolicy", "FloatDTypePolicy"):
        raise _Bad("a dtype that is neither a dtype name nor a dtype policy", unsupported=True)
    out: dict[str, Any] = {}
    for key, val in v.items():
        if key == "class_name":
            out[key] = val
        elif key == "config":
            if not isinstance(val, dict) or set(val) - {"name"}:
                raise _Bad("a dtype policy with settings other than its name", unsupported=True)
            out[key] = {"name": _str(choices=DTYPES)(val.get("name"))}
        elif key == "module":
            out[key] = _module(val)
        elif key == "registered_name":
            out[key] = _registered(val, str(v.get("class_name")))
        elif key == "shared_object_id":
            out[key] = _int(0, 2**64)(val)
        else:
            raise _Bad(f"a dtype policy with the key '{_show(key)}'", unsupported=True)
    return out


def _module(v: Any) -> Any:
    if v is not None and v not in MODULES:
        raise _Bad(f"module '{_show(v)}' is not one of Keras' own", unsupported=True)
    return v


def _registered(v: Any, cls: str) -> Any:
    if v is not None and v != cls:
        raise _Bad(f"registered_name '{_show(v)}' is not the class's own", unsupported=True)
    return v


def _object(table: dict[str, dict[str, Callable]], what: str, v: Any, drop_unknown: bool) -> Any:
    """An initializer / regularizer / constraint rebuilt from ``table`` (class -> config keys)."""
    if v is None:
        return None
    if isinstance(v, str):
        if what == "initializer" and v in INIT_NAMES:
            return v
        if what != "initializer" and v in {"l1", "l2", "l1_l2", "max_norm", "non_neg", "unit_norm",
                                           "min_max_norm", "maxnorm", "nonneg", "unitnorm"}:
            return v
        if drop_unknown:
            return _DROP
        raise _Bad(f"'{_show(v)}' is not a built-in {what}", unsupported=True)
    if not isinstance(v, dict):
        raise _Bad(f"a {type(v).__name__} where a {what} was expected")
    cls = v.get("class_name")
    keys = table.get(cls) if isinstance(cls, str) else None
    if keys is None or not isinstance(v.get("config", {}), dict):
        if drop_unknown:
            return _DROP
        raise _Bad(f"class '{_show(cls)}' is not a built-in {what} (custom and Lambda objects are never "
                   "deserialized)", unsupported=True)
    out: dict[str, Any] = {}
    for key, val in v.items():
        if key == "class_name":
            out[key] = val
        elif key == "config":
            conf = {}
            for ck, cv in val.items():
                if ck not in keys:
                    if drop_unknown:
                        return _DROP
                    raise _Bad(f"{what} {cls} with the setting '{_show(ck)}'", unsupported=True)
                conf[ck] = keys[ck](cv)
            out[key] = conf
        elif key == "module":
            out[key] = _module(val)
        elif key == "registered_name":
            out[key] = _registered(val, cls)
        elif key == "shared_object_id":
            out[key] = _int(0, 2**64)(val)
        elif key == "__passive_serialization__":
            continue  # tf_keras' marker for "deserialize me": never handed on (the object is rebuilt here)
        else:
            if drop_unknown:
                return _DROP
            raise _Bad(f"{what} {cls} with the key '{_show(key)}'", unsupported=True)
    return out


def _initializer(v: Any) -> Any:
    return _object(INITIALIZERS, "initializer", v, drop_unknown=True)


def _regularizer(v: Any) -> Any:
    return _object(REGULARIZERS, "regularizer", v, drop_unknown=False)


def _constraint(v: Any) -> Any:
    return _object(CONSTRAINTS, "constraint", v, drop_unknown=False)


def _activation(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, str):
        raise _Bad("an activation given as an object, not a built-in name", unsupported=True)
    return _str(MAX_STR, ACTIVATIONS)(v)


def _renorm_clipping(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) - {"rmax", "rmin", "dmax"}:
        raise _Bad("renorm_clipping other than {rmax, rmin, dmax}")
    return {k: _FLOAT(x) for k, x in v.items()}


def _build_config(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _Bad("a build_config that is not an object")
    out: dict[str, Any] = {}
    for key, val in v.items():
        if key == "input_shape":
            out[key] = _plain(3, MAX_LIST)(val)
        elif key == "shapes_dict":
            if not isinstance(val, dict) or len(val) > MAX_RANK:
                raise _Bad("a build_config shapes_dict that is not a small object")
            out[key] = {_str(MAX_NAME)(k): _plain(3, MAX_LIST)(s) for k, s in val.items()}
        else:
            raise _Bad(f"a build_config with the key '{_show(key)}'", unsupported=True)
    return out


_CHOICE = lambda *names: _str(MAX_STR, frozenset(names))  # noqa: E731

#: every layer config key rnnconvert knows -> its check (``None`` values pass where ``_opt``); the keys that take
#: objects (``*_initializer``, ``*_regularizer``, ``*_constraint``, ``layer``, ``backward_layer``) are handled by
#: :func:`_layer_config` itself
KEYS: dict[str, Callable[[Any], Any]] = {
    "name": _NAME, "trainable": _BOOL, "dtype": _policy, "autocast": _BOOL, "input_dtype": _opt(_policy),
    "batch_input_shape": _opt(_shape), "batch_shape": _opt(_shape), "input_shape": _opt(_shape),
    "sparse": _BOOL, "ragged": _BOOL, "optional": _BOOL, "input_tensor": lambda v: _none(v),
    "units": _SIZE, "output_dim": _SIZE, "input_dim": _SIZE, "input_length": _opt(_ints), "filters": _SIZE,
    "activation": _activation, "recurrent_activation": _activation, "inner_activation": _activation,
    "use_bias": _BOOL, "bias": _BOOL, "unit_forget_bias": _BOOL, "implementation": _int(0, 3),
    "return_sequences": _BOOL, "return_state": _BOOL, "go_backwards": _BOOL, "stateful": _BOOL, "unroll": _BOOL,
    "time_major": _BOOL, "reset_after": _BOOL, "zero_output_for_mask": _BOOL, "use_cudnn": _either(_BOOL, _CHOICE(
        "auto")),
    "dropout": _RATE, "recurrent_dropout": _RATE, "rate": _RATE, "dropout_W": _RATE, "dropout_U": _RATE,
    "consume_less": _CHOICE("cpu", "mem", "gpu"), "seed": _SEED, "noise_shape": _opt(_shape),
    "stddev": _num(0.0, MAX_FLOAT), "mask_value": _FLOAT, "mask_zero": _BOOL,
    "merge_mode": _opt(_CHOICE("sum", "mul", "concat", "ave")),
    "axis": _opt(_ints), "epsilon": _num(0.0, MAX_FLOAT), "momentum": _FLOAT, "center": _BOOL,
    "scale": _either(_BOOL, _FLOAT), "offset": _FLOAT, "renorm": _BOOL, "renorm_momentum": _FLOAT,
    "renorm_clipping": _renorm_clipping, "synchronized": _BOOL, "fused": _opt(_BOOL), "virtual_batch_size":
    _opt(_SIZE), "adjustment": lambda v: _none(v), "rms_scaling": _BOOL, "groups": _SIZE,
    "alpha": _FLOAT, "negative_slope": _FLOAT, "max_value": _opt(_FLOAT), "threshold": _FLOAT,
    "shared_axes": _opt(_ints), "l1": _num(0.0, MAX_FLOAT), "l2": _num(0.0, MAX_FLOAT),
    "kernel_size": _ints, "strides": _opt(_ints), "pool_size": _ints, "dilation_rate": _ints, "padding":
    _either(_CHOICE("valid", "same", "causal", "full"), _ints), "cropping": _ints, "size": _ints,
    "output_padding": _opt(_ints), "depth_multiplier": _SIZE,
    "data_format": _opt(_CHOICE("channels_last", "channels_first")), "keepdims": _BOOL,
    "target_shape": _shape, "dims": _ints, "n": _SIZE,
    "equation": _str(MAX_STR), "output_shape": _opt(_ints), "bias_axes": _opt(_str(MAX_STR)),
    "lora_rank": _opt(_SIZE), "lora_alpha": _opt(_FLOAT), "quantization_config": lambda v: _none(v),
    "interpolation": _str(MAX_STR), "fill_mode": _str(MAX_STR), "fill_value": _FLOAT, "mode": _str(MAX_STR),
    "factor": _nums, "height_factor": _nums, "width_factor": _nums, "value_range": _nums, "rng_type":
    _opt(_str(MAX_STR)), "data_range": _nums,
    "use_scale": _BOOL, "score_mode": _CHOICE("dot", "concat"), "causal": _BOOL,
    # MultiHeadAttention (tf_keras 2.21 / keras 3.15 ``get_config``; issue #41): sizes at least 1
    "num_heads": _int(1, MAX_INT), "key_dim": _int(1, MAX_INT), "value_dim": _opt(_int(1, MAX_INT)),
    "attention_axes": _opt(_ints), "softmax_robust_masking": _BOOL, "use_gate": _BOOL,
    "sliding_window": _opt(_int(1, MAX_INT)), "flash_attention": _opt(_BOOL), "query_shape": _opt(_shape),
    "key_shape": _opt(_shape), "value_shape": _opt(_shape),
}


def _none(v: Any) -> None:
    if v is not None:
        raise _Bad("a value where only null is read", unsupported=True)
    return None


# ----------------------------------------------------------------------------- records

class _Ctx:
    def __init__(self, where: str, unknown: str):
        self.where, self.unknown, self.count = where, unknown, 0

    def fail(self, path: str, cls: Any, key: str | None, why: str, unsupported: bool) -> None:
        at = f"layer '{_show(path, 96)}' ({_show(cls)})" if path else "the model config"
        k = f", key '{_show(key)}'" if key else ""
        head = f"{self.where}: {at}{k}: "
        if unsupported:
            msg = f"{head}{why}; rnnconvert builds Keras models from its own whitelist of settings; "
            raise UnsupportedError(msg + WAY_OUT_API, cli=msg + WAY_OUT)
        raise FormatError(f"{head}malformed model config: {why}")

    def check(self, path: str, cls: Any, key: str | None, fn: Callable[[Any], Any], v: Any) -> Any:
        try:
            return fn(v)
        except _Bad as exc:
            self.fail(path, cls, key, str(exc), exc.unsupported)
        except RecursionError:
            self.fail(path, cls, key, "nested too deeply", False)


def _layer_config(ctx: _Ctx, path: str, cls: str, conf: Any, depth: int) -> dict:
    if not isinstance(conf, dict):
        ctx.fail(path, cls, "config", "the layer's config is not an object", False)
    out: dict[str, Any] = {}
    for key, val in conf.items():
        if not isinstance(key, str):
            ctx.fail(path, cls, None, "a config key that is not a string", False)
        if key in ("layer", "backward_layer") and cls in ("Bidirectional", "TimeDistributed"):
            out[key] = None if val is None and key == "backward_layer" else _record(ctx, val, path + "/", depth + 1)
            continue
        if key.endswith("_initializer") or key in ("init", "inner_init", "forget_bias_init"):
            got = ctx.check(path, cls, key, _initializer, val)
            if got is not _DROP:
                out[key] = got
            continue
        if key.endswith("_regularizer"):
            out[key] = ctx.check(path, cls, key, _regularizer, val)
            continue
        if key.endswith("_constraint"):
            out[key] = ctx.check(path, cls, key, _constraint, val)
            continue
        fn = KEYS.get(key)
        if fn is None:
            ctx.fail(path, cls, key, "a config key rnnconvert does not know (it reads no code, no custom objects "
                     "and no setting it cannot check)", True)
        out[key] = ctx.check(path, cls, key, fn, val)
    return out


def _keras_tensor(ctx: _Ctx, path: str, v: dict) -> dict:
    conf = v.get("config")
    if set(v) - {"class_name", "config"} or not isinstance(conf, dict) \
            or set(conf) - {"shape", "dtype", "keras_history"}:
        ctx.fail(path, "__keras_tensor__", None, "a tensor reference with keys rnnconvert does not read", True)
    out: dict[str, Any] = {}
    for key, val in conf.items():
        if key == "shape":
            out[key] = ctx.check(path, "__keras_tensor__", key, _opt(_shape), val)
        elif key == "dtype":
            out[key] = ctx.check(path, "__keras_tensor__", key, _opt(_str(choices=DTYPES)), val)
        else:
            h = val
            ok = isinstance(h, list) and len(h) == 3
            if not ok:
                ctx.fail(path, "__keras_tensor__", key, "keras_history is not [layer, node, index]", False)
            out[key] = [ctx.check(path, "__keras_tensor__", key, _NAME, h[0]),
                        ctx.check(path, "__keras_tensor__", key, _int(0, MAX_INT), h[1]),
                        ctx.check(path, "__keras_tensor__", key, _int(0, MAX_INT), h[2])]
    return {"class_name": "__keras_tensor__", "config": out}


def _call_value(ctx: _Ctx, path: str, v: Any, depth: int = 4) -> Any:
    """A Keras 3 call argument: a ``__keras_tensor__`` reference, plain data, or a list of those."""
    if isinstance(v, dict):
        if v.get("class_name") != "__keras_tensor__":
            ctx.fail(path, "", "inbound_nodes", "a call argument that is an object other than a tensor reference",
                     True)
        return _keras_tensor(ctx, path, v)
    if isinstance(v, (list, tuple)):
        if depth <= 0 or len(v) > MAX_LIST:
            ctx.fail(path, "", "inbound_nodes", "call arguments nested too deeply or too many", False)
        return [_call_value(ctx, path, x, depth - 1) for x in v]
    return ctx.check(path, "", "inbound_nodes", _plain(1), v)


def _nodes(ctx: _Ctx, path: str, cls: str, nodes: Any) -> list:
    if not isinstance(nodes, list) or len(nodes) > MAX_LIST:
        ctx.fail(path, cls, "inbound_nodes", "inbound_nodes is not a list", False)
    out = []
    for node in nodes:
        if isinstance(node, dict):  # Keras 3: {'args': [...], 'kwargs': {...}}
            if set(node) - {"args", "kwargs"}:
                ctx.fail(path, cls, "inbound_nodes", "a call record with keys other than args, kwargs", True)
            rebuilt: dict[str, Any] = {}
            for key, val in node.items():
                if key == "args":
                    rebuilt[key] = _call_value(ctx, path, val)
                else:
                    if not isinstance(val, dict) or len(val) > MAX_RANK:
                        ctx.fail(path, cls, "inbound_nodes", "call keywords that are not a small object", False)
                    rebuilt[key] = {ctx.check(path, cls, "inbound_nodes", _str(MAX_STR), k): _call_value(ctx, path, x)
                                    for k, x in val.items()}
            out.append(rebuilt)
        elif isinstance(node, list):  # Keras 2: [[layer, node, tensor, {kwargs}], ...]
            if len(node) > MAX_LIST:
                ctx.fail(path, cls, "inbound_nodes", "a call with too many inputs", False)
            entries = []
            for e in node:
                if not isinstance(e, list) or not 3 <= len(e) <= 4:
                    ctx.fail(path, cls, "inbound_nodes", "an inbound node entry other than [layer, node, tensor, "
                             "{keywords}]", False)
                ent = [ctx.check(path, cls, "inbound_nodes", _NAME, e[0]),
                       ctx.check(path, cls, "inbound_nodes", _int(0, MAX_INT), e[1]),
                       ctx.check(path, cls, "inbound_nodes", _int(0, MAX_INT), e[2])]
                if len(e) == 4:
                    kw = e[3]
                    if not isinstance(kw, dict) or len(kw) > MAX_RANK:
                        ctx.fail(path, cls, "inbound_nodes", "call keywords that are not a small object", False)
                    ent.append({ctx.check(path, cls, "inbound_nodes", _str(MAX_STR), k):
                                ctx.check(path, cls, "inbound_nodes", _plain(3, MAX_RANK), x) for k, x in kw.items()})
                entries.append(ent)
            out.append(entries)
        else:
            ctx.fail(path, cls, "inbound_nodes", "an inbound node that is neither a list nor a call record", False)
    return out


def _io_list(ctx: _Ctx, key: str, v: Any) -> Any:
    """A model's ``input_layers`` / ``output_layers``: ``[name, node, index]`` or a list of those."""
    if v is None:
        return None
    if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str):
        return [ctx.check("", None, key, _NAME, v[0]), ctx.check("", None, key, _int(0, MAX_INT), v[1]),
                ctx.check("", None, key, _int(0, MAX_INT), v[2])]
    if not isinstance(v, list) or len(v) > MAX_LIST:
        ctx.fail("", None, key, f"{key} is not a list of [layer, node, index]", False)
    return [_io_list(ctx, key, x) if isinstance(x, list) else ctx.fail("", None, key, "not [layer, node, index]",
                                                                       False) for x in v]


_MODEL_KEYS = ("name", "trainable", "dtype", "build_input_shape", "input_layers", "output_layers", "layers")


def _model_conf(ctx: _Ctx, path: str, cls: str, conf: Any, depth: int) -> Any:
    prefix = path + "." if path and depth > 0 else ""  # the root model's layers are named by their own names
    if isinstance(conf, list):  # Keras <= 2.1 Sequential: a bare list of layer records
        return [_record(ctx, r, prefix, depth + 1) for r in conf]
    if not isinstance(conf, dict):
        ctx.fail(path, cls, "config", "a model config that is neither an object nor a list of layers", False)
    out: dict[str, Any] = {}
    for key, val in conf.items():
        if key == "layers":
            if not isinstance(val, list):
                ctx.fail(path, cls, key, "the model's layers are not a list", False)
            out[key] = [_record(ctx, r, prefix, depth + 1) for r in val]
        elif key in ("input_layers", "output_layers"):
            out[key] = _io_list(ctx, key, val)
        elif key == "name":
            out[key] = ctx.check(path, cls, key, _opt(_NAME), val)
        elif key == "trainable":
            out[key] = ctx.check(path, cls, key, _BOOL, val)
        elif key == "dtype":
            out[key] = ctx.check(path, cls, key, _policy, val)
        elif key == "build_input_shape":
            out[key] = ctx.check(path, cls, key, _opt(_shapes), val)
        else:
            ctx.fail(path, cls, key, "a model config key rnnconvert does not know", True)
    return out


def _record(ctx: _Ctx, rec: Any, prefix: str, depth: int) -> dict:
    """One layer record (``class_name``, ``config`` and, in a functional model, ``name``/``inbound_nodes``;
    Keras 3: ``module``, ``registered_name``, ``build_config``), rebuilt."""
    if not isinstance(rec, dict):
        ctx.fail(prefix.rstrip("./"), None, None, "a layer record that is not an object", False)
    if depth > MAX_DEPTH:
        ctx.fail(prefix.rstrip("./"), None, None, f"models nested more than {MAX_DEPTH} deep", False)
    ctx.count += 1
    if ctx.count > MAX_LAYERS:
        ctx.fail("", None, None, f"more than {MAX_LAYERS} layer records", False)
    cls = rec.get("class_name")
    conf = rec.get("config")
    name = conf.get("name") if isinstance(conf, dict) else rec.get("name")
    path = prefix + (name if isinstance(name, str) else "?")
    if not isinstance(cls, str):
        ctx.fail(path, None, "class_name", "a layer record without a class name", False)
    ctx.check(path, "?", "class_name", _NAME, cls)
    if isinstance(name, str):
        ctx.check(prefix + _show(name, 40), cls, "name", _NAME, name)
    known = cls in LAYER_CLASSES or cls in CONTAINERS
    if not known:
        if ctx.unknown != "stub":
            ctx.fail(path, cls, None, "not a built-in layer class rnnconvert builds (custom classes and Lambda "
                     "layers are never deserialized)", True)
        stub: dict[str, Any] = {"class_name": cls, "config": {"name": name} if isinstance(name, str) else {}}
        if "name" in rec:
            stub["name"] = ctx.check(path, cls, "name", _NAME, rec["name"])
        if "inbound_nodes" in rec:
            stub["inbound_nodes"] = _nodes(ctx, path, cls, rec["inbound_nodes"])
        return stub
    out: dict[str, Any] = {}
    for key, val in rec.items():
        if key == "class_name":
            out[key] = cls
        elif key == "config":
            out[key] = (_model_conf(ctx, path, cls, val, depth) if cls in CONTAINERS
                        else _layer_config(ctx, path, cls, val, depth))
        elif key == "name":
            out[key] = ctx.check(path, cls, key, _NAME, val)
        elif key == "inbound_nodes":
            out[key] = _nodes(ctx, path, cls, val)
        elif key == "module":
            out[key] = ctx.check(path, cls, key, _module, val)
        elif key == "registered_name":
            out[key] = ctx.check(path, cls, key, lambda v: _registered(v, cls), val)
        elif key == "build_config":
            out[key] = ctx.check(path, cls, key, _build_config, val)
        elif key == "shared_object_id":
            out[key] = ctx.check(path, cls, key, _int(0, 2**64), val)
        elif key in ("compile_config", "keras_version", "backend"):
            continue  # training settings and provenance: never handed to a framework
        else:
            ctx.fail(path, cls, key, "a layer record key rnnconvert does not know", True)
    return out


def model_config(config: Any, where: object, unknown: str = "refuse") -> dict:
    """``config`` (a Sequential / Functional / Model config as parsed from JSON) rebuilt from the whitelist.

    Args:
        config: the parsed config (untrusted).
        where: the file it came from, for messages.
        unknown: ``'refuse'`` (a class outside :data:`LAYER_CLASSES` is refused) or ``'stub'`` (kept as
            ``{"class_name", "config": {"name"}}`` only, for the readers: the writers refuse it by name later).

    Returns:
        a new dict, equal to ``config`` for a legitimate config (initializers outside :data:`INITIALIZERS`,
        ``compile_config`` and provenance keys dropped).

    Raises:
        UnsupportedError: an unknown class (``unknown='refuse'``), key or object (exit 4).
        FormatError: a value of the wrong type or out of range (exit 3).
    """
    ctx = _Ctx(str(where), unknown)
    if not isinstance(config, dict) or config.get("class_name") not in CONTAINERS:
        ctx.fail("", None, None, "the model config is not a Sequential or Functional model", False)
    return _record(ctx, config, "", 0)


def layer_config(cls: str, config: Any, where: object, path: str = "") -> dict:
    """One layer's ``config`` (class ``cls``, not a container) rebuilt from the whitelist: the checks of
    :func:`model_config`, for the routes that build a single Keras layer from a file's record.

    Raises:
        UnsupportedError: ``cls`` outside :data:`LAYER_CLASSES`, an unknown key or object. FormatError: a bad value.
    """
    ctx = _Ctx(str(where), "refuse")
    name = config.get("name") if isinstance(config, dict) else None
    path = path or (name if isinstance(name, str) else "?")
    if cls not in LAYER_CLASSES:
        ctx.fail(path, cls, None, "not a built-in layer class rnnconvert builds", True)
    return _layer_config(ctx, path, cls, config, 0)


def is_sanitized(config: Any) -> bool:
    """Whether ``config`` (a model config dict, a layer record or a JSON string of one) is a fixed point of the
    sanitizer: what :func:`model_config` makes, with no unknown class. The security tests' check of every dict
    that reaches a Keras deserialization entry point."""
    import json

    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except ValueError:
            return False
    if not isinstance(config, dict):
        return False
    try:
        if config.get("class_name") in CONTAINERS:
            return model_config(config, "check") == config
        cls = config.get("class_name")
        if set(config) - {"class_name", "config", "module", "registered_name", "build_config", "name",
                          "inbound_nodes", "shared_object_id"}:
            return False
        return layer_config(cls, config.get("config"), "check") == config.get("config")
    except (UnsupportedError, FormatError):
        return False
