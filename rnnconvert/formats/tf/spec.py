"""The TensorFlow family's format records: checkpoints read by :mod:`.checkpoint_read` (bundle
:mod:`.bundle_read`, table :mod:`.table_read`, TF1 cells :mod:`.tf1_cells`), TF1 checkpoints written by
:mod:`.tf1_write` (run by the ``tf_equations`` runtime on TensorFlow's read-back), TF2 object checkpoints by
:mod:`.tf2_write` (run by the ``tf_keras`` runtime); frozen graphs read by :mod:`.graph_read`. A TF source's
own equations are the ``tf_equations`` runtime, TensorFlow itself (``--verify framework``) the ``tensorflow`` one."""

from __future__ import annotations

from ...engine.protocol import FormatSpec, located
from . import (
    tf1_write,
    tf2_write,
    checkpoint_read,
    graph_read,
)

#: options of the checkpoint reader: a TF1 cell's forget_bias/gate activation/clips are not in the file;
#: num_layers/hidden_size/bidirectional pick a cuDNN opaque buffer's spec
CHECKPOINT_OPTIONS = ("forget_bias", "gate_activation", "num_layers", "hidden_size", "bidirectional",
                      "cell_clip", "proj_clip")

TF_CHECKPOINT = FormatSpec(
    # read through the SavedModel reader: a SavedModel folder's layers take their Keras names (keras_metadata.pb)
    "tf_checkpoint", read=located("rnnconvert.formats.tf.savedmodel_keras:read"), read_options=CHECKPOINT_OPTIONS,
    lazy=True,
    # a SavedModel's whole Keras model: read only for a writer of whole models
    whole_model=located("rnnconvert.formats.tf.savedmodel_keras:read_full_model"),
    refusals=tf1_write.refusals, check=tf1_write.check, write=tf1_write.write,
    runtime="tf_equations", load=tf1_write.load, route=tf1_write.ROUTE,
    equations="tf_equations", framework="tensorflow")

#: no sniffer: a TF2 object checkpoint is detected (and read) as ``checkpoint_read``
TF2_CHECKPOINT = FormatSpec(
    "tf2_checkpoint", read=located("rnnconvert.formats.tf.savedmodel_keras:read"), read_options=CHECKPOINT_OPTIONS,
    refusals=tf2_write.refusals, check=tf2_write.check, write=tf2_write.write,
    runtime="tf_keras", load=tf2_write.load, route=tf2_write.ROUTE)

TF_GRAPH = FormatSpec("tf_graph", read=graph_read.read, read_options=("activation",) + CHECKPOINT_OPTIONS)
