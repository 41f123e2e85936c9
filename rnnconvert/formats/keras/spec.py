"""The Keras family's format records (:class:`~rnnconvert.engine.protocol.FormatSpec`): Keras 1/2 HDF5
(reader :mod:`.keras_h5`, writer :mod:`.keras_h5_write`, Keras equations :mod:`.keras_math`, tf_keras
runtime :mod:`.keras_tf`) and Keras 3 (:mod:`.keras3`)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import keras3, keras_h5, keras_h5_write, keras_tf
from ...verify import keras_equations as keras_math

KERAS_H5 = FormatSpec(
    "keras_h5", sniff=keras_h5.sniff, read=keras_h5.read, lazy=True,
    # map, nonlinearity: a plain (not Keras) HDF5 file read by its tensor names (rnnconvert.core.names)
    read_options=("gate_activation", "map", "nonlinearity"),
    refusals=keras_h5_write.refusals, check=keras_h5_write.check, write=keras_h5_write.write,
    write_options=("cudnn",), open_stream=keras_h5_write.open_stream,
    source_forward=keras_math.source_forward, source_forward_multi=keras_math.source_forward_multi,
    framework_forward=keras_tf.framework_forward,
    target_forward=keras_h5_write.target_forward, target_forward_slab=keras_h5_write.target_forward_slab,
    target_step=keras_h5_write.target_step, route=keras_h5_write.ROUTE, engine=keras_h5_write.ENGINE)

KERAS3 = FormatSpec(
    "keras3", sniff=keras3.sniff, read=keras3.read, read_options=("gate_activation",),
    refusals=keras3.refusals, check=keras3.check, write=keras3.write,
    write_options=("weights_only", "recurrent_only"),
    target_forward=keras3.target_forward, target_step=keras3.target_step, verify_whole=keras3.verify_whole,
    route=keras3.ROUTE, engine=keras3.ENGINE, rescale_plan=keras3.rescale_plan)
