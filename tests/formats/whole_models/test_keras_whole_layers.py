"""Issue #28: every Keras 3 built-in layer the whole-model translation accepts computes, at inference, what
its Keras 2 counterpart computes, with the config tf_keras 2.21 writes for it.

Oracle: tf_keras running a one-layer model (gate-free, weights drawn here), against Keras 3 running the
model built from the translated config (:func:`rnnconvert.formats.keras.keras_whole.translate`) with the
same weights (rescaled by rnnconvert where the layer's activation is Keras-2 ``hard_sigmoid``). The full
pipeline (read, write, verify) runs on the ``keras_whole`` fixtures (tests/formats/whole_models/test_keras_whole.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rnnconvert.errors import UnsupportedError

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

S1, S2, S3 = (7, 6), (8, 8, 3), (4, 6, 6, 2)
HS = {"activation": "hard_sigmoid"}
#: Keras 2 class -> (constructor keywords, input shape without the batch)
CASES = {
    "ActivityRegularization": ({"l1": 0.01, "l2": 0.02}, S1),
    "PReLU": ({"shared_axes": [1]}, S1),
    "LeakyReLU": ({"alpha": 0.2}, S1),  # Keras 3: negative_slope
    "ELU": ({"alpha": 0.7}, S1),
    "ReLU": ({"max_value": 1.5, "negative_slope": 0.1, "threshold": 0.2}, S1),
    "Softmax": ({"axis": 1}, S1),
    "Activation": ({"activation": "softsign"}, S1),
    "Dropout": ({"rate": 0.3, "seed": 3}, S1),
    "SpatialDropout1D": ({"rate": 0.3}, S1),
    "GaussianNoise": ({"stddev": 0.3}, S1),
    "GaussianDropout": ({"rate": 0.3}, S1),
    "AlphaDropout": ({"rate": 0.3}, S1),
    "Masking": ({"mask_value": 0.5}, S1),
    "Cropping1D": ({"cropping": (1, 2)}, S1),
    "ZeroPadding1D": ({"padding": (2, 1)}, S1),
    "UpSampling1D": ({"size": 3}, S1),
    "MaxPooling1D": ({"pool_size": 3, "strides": 2, "padding": "same"}, S1),
    "AveragePooling1D": ({"pool_size": 3, "strides": 1}, S1),
    "GlobalMaxPooling1D": ({"keepdims": True}, S1),
    "GlobalAveragePooling1D": ({}, S1),
    "LayerNormalization": ({"epsilon": 1e-3}, S1),
    "BatchNormalization": ({"epsilon": 1e-2, "momentum": 0.9}, S1),  # tf_keras writes axis as a list
    "UnitNormalization": ({"axis": -1}, S1),
    "GroupNormalization": ({"groups": 3}, S1),
    "Rescaling": ({"scale": 0.5, "offset": -0.25}, S1),
    "Identity": ({}, S1),
    "Dense": ({"units": 3, **HS}, S1),
    "Conv1D": ({"filters": 4, "kernel_size": 3, "dilation_rate": 2, "padding": "causal", **HS}, S1),
    "Conv1DTranspose": ({"filters": 4, "kernel_size": 3, "strides": 2, **HS}, S1),  # groups=1 dropped
    "SeparableConv1D": ({"filters": 4, "kernel_size": 3, "depth_multiplier": 2}, S1),
    "DepthwiseConv1D": ({"kernel_size": 3, "depth_multiplier": 2, **HS}, S1),
    "EinsumDense": ({"equation": "abc,cd->abd", "output_shape": (None, 5), "bias_axes": "d", **HS}, S1),
    "Flatten": ({}, S1),
    "Reshape": ({"target_shape": (6, 7)}, S1),
    "Permute": ({"dims": (2, 1)}, S1),
    "RepeatVector": ({"n": 3}, (5,)),
    "Conv2D": ({"filters": 4, "kernel_size": 3, "strides": 2, "padding": "same", **HS}, S2),
    "Conv2DTranspose": ({"filters": 2, "kernel_size": 3, "strides": 2, **HS}, S2),
    "SeparableConv2D": ({"filters": 4, "kernel_size": 3}, S2),
    "DepthwiseConv2D": ({"kernel_size": 3, "depth_multiplier": 2, **HS}, S2),
    "MaxPooling2D": ({"pool_size": 2}, S2),
    "AveragePooling2D": ({"pool_size": 3, "strides": 2, "padding": "same"}, S2),
    "GlobalMaxPooling2D": ({}, S2),
    "GlobalAveragePooling2D": ({}, S2),
    "ZeroPadding2D": ({"padding": ((1, 2), (0, 1))}, S2),
    "Cropping2D": ({"cropping": ((1, 2), (0, 1))}, S2),
    "UpSampling2D": ({"size": 2}, S2),
    "SpatialDropout2D": ({"rate": 0.3}, S2),
    "RandomFlip": ({"seed": 1}, S2),
    "RandomRotation": ({"factor": 0.2}, S2),
    "RandomZoom": ({"height_factor": 0.2}, S2),
    "RandomTranslation": ({"height_factor": 0.2, "width_factor": 0.1}, S2),
    "RandomContrast": ({"factor": 0.3}, S2),
    "RandomBrightness": ({"factor": 0.3}, S2),
    "Conv3D": ({"filters": 3, "kernel_size": 2, **HS}, S3),
    "Conv3DTranspose": ({"filters": 2, "kernel_size": 2}, S3),
    "MaxPooling3D": ({"pool_size": 2}, S3),
    "AveragePooling3D": ({"pool_size": 2}, S3),
    "GlobalMaxPooling3D": ({}, S3),
    "GlobalAveragePooling3D": ({}, S3),
    "ZeroPadding3D": ({"padding": 1}, S3),
    "Cropping3D": ({"cropping": 1}, S3),
    "UpSampling3D": ({"size": 2}, S3),
    "SpatialDropout3D": ({"rate": 0.3}, S3),
}


def _one_layer(k2, cls, kw, shape, rng):
    k2.backend.clear_session()
    lay = getattr(k2.layers, cls)(name="lay", **kw)
    model = k2.Sequential([k2.Input(shape, name="x"), lay])
    ws = [rng.uniform(0.5, 1.5, w.shape).astype(np.float32) if "variance" in w.name
          else rng.uniform(-1, 1, w.shape).astype(np.float32) for w in lay.weights]
    lay.set_weights(ws)
    return model, ws


def _translate(model):
    from rnnconvert.formats.keras import keras_whole

    return keras_whole.translate(keras_whole.FullModel("model.h5", json.loads(model.to_json()), "2.21.0"))


@pytest.mark.parametrize("cls", list(CASES))
def test_accepted_layer_computes_what_tf_keras_computes(cls, k2, k3):
    from rnnconvert.formats.keras import keras_config, keras_whole

    assert cls in keras_config.LAYERS and hasattr(k3.layers, keras_config.LAYERS[cls])
    kw, shape = CASES[cls]
    rng = np.random.default_rng(28)
    model, ws = _one_layer(k2, cls, kw, shape, rng)
    tr = _translate(model)
    m3 = k3.saving.deserialize_keras_object(tr.config, safe_mode=True)
    lay = m3.get_layer("lay")
    assert type(lay).__name__ == keras_config.LAYERS[cls]
    lay.set_weights(keras_whole.rescale(ws, tr.rescale.get("lay"), None))
    x = rng.standard_normal((3,) + shape).astype(np.float32) * 2
    want = np.asarray(model(x, training=False), np.float64)
    got = np.asarray(k3.ops.convert_to_numpy(m3(x, training=False)), np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, np.abs(want).max()), cls
    if kw.get("activation") == "hard_sigmoid":  # the rescale is what makes it equal: without it, it is not
        assert tr.rescale["lay"].all
        lay.set_weights(ws)
        assert np.abs(np.asarray(k3.ops.convert_to_numpy(m3(x, training=False))) - want).max() > 1e-3


def test_separable_conv_hard_sigmoid_refused_by_name(k2):
    """Two kernels multiply: scaling both by 1.2 scales the pre-activation by 1.44; no rescale, a refusal."""
    model, _ = _one_layer(k2, "SeparableConv1D", {"filters": 2, "kernel_size": 3, **HS}, S1,
                          np.random.default_rng(0))
    with pytest.raises(UnsupportedError, match=r"layer 'lay' \(SeparableConv1D\).*hard_sigmoid.*recurrent_only"):
        _translate(model)


def test_every_shared_builtin_is_accepted_or_refused_with_a_reason(k2, k3):
    """Keras 3's layer list against the whitelist: every class both Keras 2 (tf_keras) and Keras 3 have as a
    layer is translated (and checked above) or has its reason in NOT_TRANSLATED; aliases (Convolution1D,
    MaxPool1D, ...) are never a saved class name."""
    from rnnconvert.formats.keras import keras_config

    def layers(mod):
        out = {}
        for n in dir(mod.layers):
            c = getattr(mod.layers, n)
            if isinstance(c, type) and issubclass(c, mod.layers.Layer) and c.__name__ == n:
                out[n] = c
        return out

    shared = set(layers(k2)) & set(layers(k3))
    abstract = {"Layer", "InputLayer", "Wrapper", "LSTMCell", "GRUCell", "SimpleRNNCell", "Input"}
    missing = sorted(c for c in shared - abstract
                     if c not in keras_config.LAYERS and c not in keras_config.NOT_TRANSLATED)
    assert not missing, f"neither translated nor refused with a reason: {missing}"
    checked = set(CASES) | set(keras_config.RECURRENT) | {"Bidirectional", "TimeDistributed", "Embedding",
                                                          "Concatenate", "Add", "Subtract", "Multiply", "Average",
                                                          "Maximum", "Minimum"}
    unchecked = sorted(c for c in keras_config.LAYERS if c in shared - abstract and c not in checked)
    assert not unchecked, f"accepted but not checked against tf_keras here: {unchecked}"


def test_refused_builtin_names_its_reason(k2):
    k2.backend.clear_session()
    model = k2.Sequential([k2.Input((3, 5, 5, 1), name="x"),
                           k2.layers.ConvLSTM2D(2, 3, name="clstm"), k2.layers.Flatten(name="f")])
    with pytest.raises(UnsupportedError, match=r"layer 'clstm' \(ConvLSTM2D\).*convolutional LSTM.*recurrent_only"):
        _translate(model)
