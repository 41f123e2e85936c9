"""The runtimes: one module per framework that executes canonical layers for verification, each declaring one
:class:`~rnnconvert.engine.protocol.Runtime` (``RUNTIME``). Containers name them
(:attr:`~rnnconvert.engine.protocol.FormatSpec.runtime`, ``equations``, ``framework``); verification
(:mod:`rnnconvert.verify`) looks them up here, loading a runtime's module (and so its framework) on first use.

| runtime | module | runs |
|---|---|---|
| ``torch`` | :mod:`.torch` | ``torch.nn`` modules on a written state dict (``.pt``, safetensors) |
| ``torch_export`` | :mod:`rnnconvert.whole.runtimes.torch_export` | a written ``.pt2`` program (``torch.export.load``): whole-model and per-layer output checks |
| ``canonical`` | :mod:`.canonical` | a file read back by rnnconvert's reader: ``torch.nn``, or the numpy reference where torch cannot express the layer (npz, cuDNN buffers) |
| ``onnxruntime`` | :mod:`.onnxruntime` | the written ONNX graph (one-node graphs for single slabs and steps) |
| ``tf_keras`` | :mod:`.tf_keras` | tf_keras layers loading a written Keras HDF5 file or restoring a TF2 object checkpoint; a Keras source file (``--verify framework``) |
| ``keras3`` | :mod:`.keras3` | Keras 3 loading a written ``.keras`` / ``.weights.h5``; whole models |
| ``tensorflow`` | :mod:`.tensorflow` | TensorFlow reading back a TF1 checkpoint (TF1 cell equations in numpy); a TF source file (``--verify framework``) |
| ``mlx`` | :mod:`.mlx` | MLX loading a written MLX safetensors file into ``mlx.nn`` modules; an MLX source file (``--verify framework``) |
| ``openvino`` | :mod:`.openvino` | the OpenVINO runtime (CPU, f32) on a written IR (one-node models for slabs and steps) |
| ``tflite`` | :mod:`.tflite` | ``tf.lite.Interpreter`` running a written ``.tflite`` (fused LSTM ops) |
| ``paddle`` | :mod:`.paddle` | ``paddle.nn`` layers loading a written ``.pdparams`` (``paddle.load``); without Paddle, the ``torch`` runtime on its tensors as read back |
| ``flax`` | :mod:`.flax` | Flax linen cells (JAX) applied to a written Flax msgpack file; a linen source file (``--verify framework``) |
| ``keras_equations`` | :mod:`rnnconvert.verify.keras_equations` | the Keras equations on a Keras source's stored tensors (numpy) |
| ``tf_equations`` | :mod:`rnnconvert.verify.tf1_equations` | the equations of a TF checkpoint's cells (TF1 cells, or the Keras equations of a TF2 object checkpoint) on its stored tensors; a written TF1 checkpoint as TensorFlow reads it back |
"""

from __future__ import annotations

import importlib

from ..engine.protocol import Runtime

#: runtime name -> ``"module:RECORD"`` (loaded on first use, so that ``import rnnconvert`` stays light)
RUNTIMES: dict[str, str] = {
    "torch": "rnnconvert.runtimes.torch:RUNTIME",
    "torch_export": "rnnconvert.whole.runtimes.torch_export:RUNTIME",
    "canonical": "rnnconvert.runtimes.canonical:RUNTIME",
    "onnxruntime": "rnnconvert.runtimes.onnxruntime:RUNTIME",
    "tf_keras": "rnnconvert.runtimes.tf_keras:RUNTIME",
    "keras3": "rnnconvert.runtimes.keras3:RUNTIME",
    "tensorflow": "rnnconvert.runtimes.tensorflow:RUNTIME",
    "keras_equations": "rnnconvert.verify.keras_equations:RUNTIME",
    "tf_equations": "rnnconvert.verify.tf1_equations:RUNTIME",
    "mlx": "rnnconvert.runtimes.mlx:RUNTIME",
    "openvino": "rnnconvert.runtimes.openvino:RUNTIME",
    "flax": "rnnconvert.runtimes.flax:RUNTIME",
    "paddle": "rnnconvert.runtimes.paddle:RUNTIME",
    "tflite": "rnnconvert.runtimes.tflite:RUNTIME",
}


def get(name: str) -> Runtime:
    """The registered runtime ``name``.

    Raises:
        KeyError: no runtime of that name (a container naming an unregistered runtime is a programming error,
        caught by ``tests/engine/test_formats_contract.py``)."""
    module, _, attr = RUNTIMES[name].partition(":")
    rt = getattr(importlib.import_module(module), attr)
    if not isinstance(rt, Runtime) or rt.name != name:
        raise RuntimeError(f"{RUNTIMES[name]} is not the Runtime {name!r}")
    return rt
