"""PyTorch naming, read by both the reader (:mod:`.torch_pt`) and the writer (:mod:`.pt_writer`): the
``torch.nn`` class of each cell, the constructor arguments of the module that loads a layer, and whether
a layer came from an ``nn.*Cell`` (suffix-less state-dict keys). Source: ``torch/nn/modules/rnn.py``."""

from __future__ import annotations

from typing import Any

from ...core.model import Cell, RNNLayer

#: the ``torch.nn`` class of each cell (``RNN`` takes ``nonlinearity='relu'`` for RNN_RELU)
MODULE = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}


def is_cell(layer: RNNLayer) -> bool:
    """Read from an ``nn.LSTMCell/GRUCell/RNNCell``: written back with its suffix-less keys."""
    return str(layer.source.get("class_name", "")).endswith("Cell") and layer.source.get("format") in (
        "pt", "safetensors") and layer.num_layers == 1 and not layer.bidirectional and not layer.proj_size


def module_args(layer: RNNLayer) -> dict[str, Any]:
    """Constructor arguments of the ``torch.nn`` module that loads ``layer`` (``batch_first=True``)."""
    args: dict[str, Any] = {"input_size": layer.input_size, "hidden_size": layer.hidden_size}
    if layer.num_layers != 1:
        args["num_layers"] = layer.num_layers
    if layer.cell is Cell.RNN_RELU:
        args["nonlinearity"] = "relu"
    if not layer.bias:
        args["bias"] = False
    if layer.bidirectional:
        args["bidirectional"] = True
    if layer.proj_size:
        args["proj_size"] = layer.proj_size
    args["batch_first"] = True
    return args


def describe_module(layer: RNNLayer) -> str:
    """``"rnn_1: nn.LSTM(input_size=100, hidden_size=128, batch_first=True)"`` (``nn.LSTMCell(...)`` for cells)."""
    if is_cell(layer):
        args = {k: v for k, v in module_args(layer).items() if k != "batch_first"}
        a = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in args.items())
        return f"{layer.name}: nn.{MODULE[layer.cell]}Cell({a})"
    a = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in module_args(layer).items())
    return f"{layer.name}: nn.{MODULE[layer.cell]}({a})"
