"""PaddlePaddle ``paddle.nn.LSTM``/``GRU``/``SimpleRNN`` state-dict names, read by the ``.pdparams`` reader and
writer. Source: ``paddle/nn/layer/rnn.py`` (PaddlePaddle 3.3.1), ``RNNBase.__init__``:

* each stacked layer ``k`` is a sub-layer ``{k}`` holding ``cell`` (one direction) or ``cell_fw``/``cell_bw``,
  whose parameters are ``weight_ih`` ``(G*H, I_k)``, ``weight_hh`` ``(G*H, H or P)``, ``bias_ih``, ``bias_hh``
  ``(G*H,)`` and, for an LSTM with ``proj_size``, ``weight_ho`` ``(H, P)`` (``h = h @ weight_ho``);
* the same parameters are exposed a second time as attributes ``weight_ih_l{k}[_reverse]``, ``weight_hh_...``,
  ``bias_ih_...``, ``bias_hh_...`` -- names zipped with ``self.parameters()`` in order, four names per cell (no
  ``weight_ho``), so with a projection every name after the first cell points one parameter further per cell.
"""

from __future__ import annotations

import re

#: a per-cell parameter: prefix, stacked layer, direction suffix, parameter
CELL_KEY = re.compile(r"^(?P<pre>(?:.*\.)?)(?P<k>\d+)\.(?P<cell>cell|cell_fw|cell_bw)\."
                      r"(?P<p>weight_ih|weight_hh|bias_ih|bias_hh|weight_ho)$")
#: a flat alias
FLAT_KEY = re.compile(r"^(?P<pre>(?:.*\.)?)(?P<p>weight_ih|weight_hh|bias_ih|bias_hh)_l(?P<k>\d+)(?P<rev>_reverse)?$")
PARAMS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_ho")
CLASS = {4: "LSTM", 3: "GRU", 1: "SimpleRNN"}


def cell_key(pre: str, k: int, d: int, bidirectional: bool, p: str) -> str:
    """``{pre}{k}.cell[_fw|_bw].{p}``."""
    cell = ("cell_fw", "cell_bw")[d] if bidirectional else "cell"
    return f"{pre}{k}.{cell}.{p}"


def flat_names(pre: str, num_layers: int, dirs: int, bias_ih: bool, bias_hh: bool) -> list[str]:
    """The flat attribute names in ``RNNBase.__init__``'s order (zipped with the parameters by the caller)."""
    out = []
    for k in range(num_layers):
        for d in range(dirs):
            sfx = "_reverse" if d == 1 else ""
            out += [f"{pre}weight_ih_l{k}{sfx}", f"{pre}weight_hh_l{k}{sfx}"]
            out += [f"{pre}bias_ih_l{k}{sfx}"] if bias_ih else []
            out += [f"{pre}bias_hh_l{k}{sfx}"] if bias_hh else []
    return out
