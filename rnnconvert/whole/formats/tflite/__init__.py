"""A whole Keras 1/2 model as one TensorFlow Lite / LiteRT flatbuffer (:mod:`.model_write`, issue #41)."""
