"""Runtime profiles of the whole-model ONNX graph (issue #41; write option ``runtime``, CLI ``--runtime``): the
form of the recurrent nodes a named runtime accepts, and the notes that warn when the default graph uses what a
runtime is known to reject.

``onnxruntime`` (the default) writes native ``LSTM`` / ``GRU`` / ``RNN`` nodes with any activation the ONNX
operator spec lists (onnxruntime runs them all; the project's verification runs it). ``openvino`` writes every
recurrent node as ``Scan`` s of elementwise ops (:mod:`.scan_cells`). OpenVINO 2026.4 reads native nodes but its
CPU plugin's
``LSTMCellDecomposition`` / ``GRUCellDecomposition`` / ``RNNCellDecomposition`` refuse other activations at
``compile_model`` ("Unsupported activation function", ``transformations/utils/utils.cpp``), found by compiling
this project's fixtures: ``HardSigmoid`` (Keras 2's default ``hard_sigmoid`` gates), ``Affine`` (``linear``),
``Softsign`` refused; ``linear_before_reset=0`` GRUs with sigmoid/tanh compile and match tf_keras
(``tests/formats/whole_models/test_whole_runtime_openvino.py``), but the native nodes it compiles do not all compute what
onnxruntime and tf_keras do: given ``sequence_lens`` (a masked layer) with a symbolic time or batch dimension (as
every whole-model graph has), a lone ``LSTM`` / ``GRU`` / ``RNN`` node's ``Y`` and states differ from
onnxruntime's (by up to 1.9 for lengths ``[5, 3]`` of 5 steps; the same node with static shapes, or with initial
states and no ``sequence_lens``, matches), and in this project's masked fixtures the returned states differ by up
to 0.15 (``whole_masks/masks_gru_stack``, ``masks_bidir``, ``keras_whole/whole_masked_stack``,
``whole_states/whole_states_lstm_seq2seq``), where the same graphs' Scans match. Hence no native node in this
profile.

``tensorrt`` keeps native nodes whose activations are all ``Sigmoid`` / ``Tanh`` / ``Relu`` (onnx-tensorrt's
operator list, github.com/onnx/onnx-tensorrt ``operators.md``, lists ``LSTM`` / ``GRU`` / ``RNN`` and ``Scan``;
NVIDIA/TensorRT#1417: ``HardSigmoid`` in an RNN node is refused) and writes the others (Keras 2's ``hard_sigmoid`` gates, ``linear``) as Scans; TensorRT cannot run
on this project's machines (no GPU), so these graphs are checked by onnxruntime against tf_keras only
(``tests/formats/whole_models/test_whole_runtime_profiles.py``).

No ``onnx2tf`` profile: onnx2tf 1.29.24 (with its pinned TensorFlow 2.19, in a separate venv) converts none of the
forms tried correctly (issue #41, measured): a native reset-before hard_sigmoid GRU node (the Mycroft model)
converts, but its ``.tflite`` takes the time axis as the batch (``(29, 1)`` outputs for a ``(6, 29, 13)`` input,
with ``-kat`` too); a Bidirectional LSTM node fails (``'NoneType' object is not subscriptable``); the mask
compaction fails at ``Range``; the Scans of :mod:`.scan_cells` fail in its ``ops/Scan.py``
(``tf.TensorArray(size=<KerasTensor>)``, with static input shapes too).

A further runtime is one more :class:`Profile` in :data:`PROFILES` (its accepted native activations) and, where
known, an entry in :data:`REJECTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import OptionError


@dataclass(frozen=True)
class Profile:
    """``native``: the activations a native recurrent node may have (``None``: every one the spec lists);
    ``doc``: what the profile writes, for the notes; ``lens``: the ops whose native node the runtime computes
    right with ``sequence_lens`` (``None``: all)."""

    name: str
    native: frozenset | None
    doc: str
    lens: frozenset | None = None


PROFILES = {
    "onnxruntime": Profile("onnxruntime", None, "native LSTM/GRU/RNN nodes"),
    "openvino": Profile("openvino", frozenset(), "OpenVINO 2026.4 refuses some activations in native nodes and "
                        "computes some states of the others otherwise"),
    # TensorRT: onnx-tensorrt's operator matrix lists LSTM / GRU / RNN, Scan and every elementwise op the Scans use;
    # HardSigmoid (and the other non-default activations) in RNN nodes are refused (NVIDIA/TensorRT#1417): native
    # nodes keep Sigmoid / Tanh / Relu only. Not run here (no GPU): checked by onnxruntime alone.
    "tensorrt": Profile("tensorrt", frozenset({"Sigmoid", "Tanh", "Relu"}),
                        "TensorRT refuses HardSigmoid and other non-default activations in RNN nodes, "
                        "NVIDIA/TensorRT#1417; TensorRT itself did not check this graph here"),
}
#: the write option's values, the default first
RUNTIMES = tuple(PROFILES)
DEFAULT = RUNTIMES[0]

#: runtimes known to reject native recurrent nodes with some activations: (the runtime and the source, the
#: activations it accepts)
REJECTS = [
    ("OpenVINO 2026.4 (compile_model: GRUCellDecomposition / LSTMCellDecomposition 'Unsupported activation "
     "function'; --runtime openvino writes them as Scans)", frozenset({"Sigmoid", "Tanh", "Relu"})),
    ("TensorRT (HardSigmoid in RNN nodes, NVIDIA/TensorRT#1417; --runtime tensorrt writes them as Scans) and "
     "rknn-toolkit (HardSigmoid, rockchip-linux/rknn-toolkit#183)", frozenset({"Sigmoid", "Tanh", "Relu", "Affine",
                                                                             "Softsign"})),
]


def profile(runtime) -> Profile:
    """The :class:`Profile` named ``runtime`` (``None``: the default).

    Raises:
        OptionError: another name (one line naming the valid ones; exit 2)."""
    if runtime is None:
        runtime = DEFAULT
    if runtime not in PROFILES:
        raise OptionError(f"write option runtime is one of {', '.join(RUNTIMES)} (default {DEFAULT}), "
                          f"got {runtime!r}")
    return PROFILES[runtime]


def native(p: Profile, activations: list[str], op: str = "LSTM", lens: bool = False) -> bool:
    """Whether a recurrent ``op`` node of ``activations`` (ONNX names), given ``sequence_lens`` when ``lens``, is
    written natively under ``p``."""
    return ((p.native is None or set(activations) <= p.native)
            and not (lens and p.lens is not None and op not in p.lens))


def notes(p: Profile, layers: dict[str, list[str]], done: list[str] = (), states: list[str] = ()) -> list[str]:
    """The conversion's notes for recurrent layers of ONNX activations ``layers`` (name -> activations): under
    the default profile a warning per runtime known to reject some of them, and one for the layers ``states``
    (given ``sequence_lens``) whose native nodes OpenVINO computes otherwise (module docstring); under another
    profile the layers it wrote as Scans (``done``)."""
    out = []
    if p.native is None:
        for who, ok in REJECTS:
            bad = {n: sorted(set(a) - ok) for n, a in layers.items() if set(a) - ok}
            if bad:
                out.append("warning: " + "; ".join(f"layer '{n}' uses {', '.join(a)}" for n, a in bad.items())
                           + f" in its ONNX recurrent node, which {who} rejects")
        if states:
            out.append(f"warning: layer(s) {', '.join(repr(n) for n in states)} take sequence_lens (a mask) in their "
                       "ONNX recurrent nodes, which OpenVINO 2026.4 computes otherwise than onnxruntime and tf_keras "
                       "with a free time or batch axis (measured); --runtime openvino writes them as Scans")
        return out
    if done:
        out.append(f"runtime profile '{p.name}': recurrent layer(s) {', '.join(repr(n) for n in done)} written as "
                   f"Scans of elementwise ops ({p.doc})")
    return out
