"""The TensorFlow family's format records: checkpoints read by :mod:`.tf_checkpoint` (bundle
:mod:`.tf_bundle`, table :mod:`.tf_table`, TF1 cells :mod:`.tf1_cells` and equations :mod:`.tf1_math`),
TF1 checkpoints written by :mod:`.tf1_writer`, TF2 object checkpoints by :mod:`.tf2_writer`, TF itself
run by :mod:`.tf_framework`; frozen graphs read by :mod:`.tf_graph`."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import tf1_writer, tf2_writer, tf_checkpoint, tf_framework, tf_graph

#: options of the checkpoint reader: a TF1 cell's forget_bias/gate activation/clips are not in the file;
#: num_layers/hidden_size/bidirectional pick a cuDNN opaque buffer's spec
CHECKPOINT_OPTIONS = ("forget_bias", "gate_activation", "num_layers", "hidden_size", "bidirectional",
                      "cell_clip", "proj_clip")

TF_CHECKPOINT = FormatSpec(
    "tf_checkpoint", sniff=tf_checkpoint.sniff, read=tf_checkpoint.read, read_options=CHECKPOINT_OPTIONS,
    lazy=True, refusals=tf1_writer.refusals, check=tf1_writer.check, write=tf1_writer.write,
    source_forward=tf_checkpoint.source_forward, source_forward_multi=tf_checkpoint.source_forward_multi,
    framework_forward=tf_framework.framework_forward, target_forward=tf1_writer.target_forward,
    route=tf1_writer.ROUTE, engine=tf1_writer.ENGINE)

#: no sniffer: a TF2 object checkpoint is detected (and read) as ``tf_checkpoint``
TF2_CHECKPOINT = FormatSpec(
    "tf2_checkpoint", read=tf_checkpoint.read, read_options=CHECKPOINT_OPTIONS,
    refusals=tf2_writer.refusals, check=tf2_writer.check, write=tf2_writer.write,
    target_forward=tf2_writer.target_forward, target_step=tf2_writer.target_step, route=tf2_writer.ROUTE,
    engine=tf2_writer.ENGINE)

TF_GRAPH = FormatSpec("tf_graph", read=tf_graph.read, read_options=("activation",) + CHECKPOINT_OPTIONS)
