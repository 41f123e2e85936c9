"""The whole-model graph of a Keras full model (:mod:`.keras_graph`)."""
