"""The whole-model writers, by the container they write (ONNX, ``.pt2``, ``nn.Module`` source) and the whole model behind a Keras checkpoint."""
