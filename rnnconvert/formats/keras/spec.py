"""The Keras family's format records (:class:`~rnnconvert.engine.protocol.FormatSpec`): Keras 1/2 HDF5
(reader :mod:`.h5_read`, writer :mod:`.h5_write`; run by the ``tf_keras`` runtime, the source's own
equations by ``keras_equations``) and Keras 3 (:mod:`.keras3`, run by the ``keras3`` runtime)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec, located
from . import keras3, h5_read, h5_write

KERAS_H5 = FormatSpec(
    "keras_h5", read=h5_read.read, lazy=True,
    # map, nonlinearity: a plain (not Keras) HDF5 file read by its tensor names (rnnconvert.core.names)
    read_options=("gate_activation", "map", "nonlinearity"),
    # the whole model (config and every layer's weights): read only for a writer of whole models
    whole_model=located("rnnconvert.formats.keras.keras_whole:read_full_model"),
    refusals=h5_write.refusals, check=h5_write.check, write=h5_write.write,
    write_options=("cudnn",), open_stream=h5_write.open_stream,
    runtime="tf_keras", load=h5_write.load, route="tf_keras",
    equations="keras_equations", framework="tf_keras")

KERAS3 = FormatSpec(
    "keras3", read=keras3.read, read_options=("gate_activation",), whole_model=keras3.read_full_model,
    refusals=keras3.refusals, check=keras3.check, write=keras3.write,
    write_options=("weights_only", "recurrent_only"),
    runtime="keras3", load=keras3.load, route=keras3.ROUTE, rescale_plan=keras3.rescale_plan)
