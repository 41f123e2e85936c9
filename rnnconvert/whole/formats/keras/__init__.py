"""The whole Keras model behind a checkpoint, whichever Keras wrote it (:mod:`.whole_source`)."""
