"""A whole Keras model as one ONNX graph (:mod:`.model_write`)."""
