"""Whole-model runtimes: ``torch_export`` (:mod:`.torch_export`) and the whole-model checks of the ``onnxruntime`` (:mod:`.onnx_whole`) and ``keras3`` (:mod:`.keras3_whole`) runtimes."""
