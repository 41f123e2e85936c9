"""The end-to-end checks of whole models (:mod:`.keras_whole_check`)."""
