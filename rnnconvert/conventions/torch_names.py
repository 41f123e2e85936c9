"""PyTorch naming, read by both the readers (:mod:`rnnconvert.formats.torch.pt_read`, ``safetensors_fmt``) and the writers
(:mod:`rnnconvert.formats.torch.pt_write`, ``safetensors_fmt``): the ``torch.nn`` class of each cell, the constructor arguments of
the module that loads a layer, whether a layer came from an ``nn.*Cell`` (suffix-less state-dict keys), and
the state-dict key of every recurrent parameter. Source: ``torch/nn/modules/rnn.py`` (``RNNBase.__init__``
names its parameters ``weight_ih_l{k}{suffix}``, ``weight_hh_l{k}{suffix}``, ``bias_ih_l{k}{suffix}``,
``bias_hh_l{k}{suffix}``, ``weight_hr_l{k}{suffix}`` with ``suffix = '_reverse'`` for the backward
direction; ``RNNCellBase`` names them without ``_l{k}``); ``torch.nn.Module.state_dict`` prefixes a
submodule's keys with ``<name>.``."""

from __future__ import annotations

import re
from typing import Any

from ..core.model import Cell, RNNLayer

#: the ``torch.nn`` class of each cell (``RNN`` takes ``nonlinearity='relu'`` for RNN_RELU)
MODULE = {Cell.LSTM: "LSTM", Cell.GRU: "GRU", Cell.RNN_TANH: "RNN", Cell.RNN_RELU: "RNN"}

#: one direction's parameters in ``torch.nn``'s order: (name stem, :class:`~rnnconvert.core.model.
#: DirectionParams` field); ``bias_*`` only with ``bias=True``, ``weight_hr`` only with ``proj_size``
PARAMS = (("weight_ih", "w_ih"), ("weight_hh", "w_hh"), ("bias_ih", "b_ih"), ("bias_hh", "b_hh"),
          ("weight_hr", "w_hr"))

#: a recurrent module's first key: ``<prefix>.weight_ih_l{k}[_reverse]`` (nn.LSTM/GRU/RNN) or
#: ``<prefix>.weight_ih`` (nn.LSTMCell/GRUCell/RNNCell); groups ``prefix``, ``k``, ``rev``
FIRST_KEY = re.compile(r"^(?:(?P<prefix>.*)\.)?weight_ih(?:_l(?P<k>\d+)(?P<rev>_reverse)?)?$")

#: any recurrent parameter's name below its module's prefix
PARAM_NAME = re.compile(r"^(weight_ih|weight_hh|weight_hr|bias_ih|bias_hh)(_l\d+(_reverse)?)?$")


def suffix(k: int, d: int, cell: bool = False) -> str:
    """The key suffix of stacked layer ``k``, direction ``d`` (1: ``_reverse``); ``''`` for an ``nn.*Cell``."""
    return "" if cell else f"_l{k}" + ("_reverse" if d else "")


def param_key(prefix: str, stem: str, k: int, d: int, cell: bool = False) -> str:
    """``<prefix>.<stem><suffix>`` (no ``<prefix>.`` when ``prefix`` is empty), e.g.
    ``param_key('lstm', 'weight_ih', 1, 1) == 'lstm.weight_ih_l1_reverse'``."""
    return f"{prefix}.{stem}{suffix(k, d, cell)}" if prefix else f"{stem}{suffix(k, d, cell)}"


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
