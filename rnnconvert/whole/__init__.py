"""The whole-model compiler (issue #30, #38): a Keras full model (:class:`rnnconvert.conventions.full_model.FullModel`,
found by its family's reader) as one graph (:mod:`.conventions.keras_graph`), written as an ONNX graph, a
``torch.export`` program or ``nn.Module`` source (:mod:`.formats`), run and checked end to end (:mod:`.runtimes`,
:mod:`.verify`), and the conversion steps that only whole models take (:mod:`.pipeline`).

One room above ``formats/`` and ``runtimes/`` (docs/architecture.md): it imports them, they never import it;
the records below name its operations by location, loaded when a whole model is written or checked
(:func:`rnnconvert.engine.protocol.located`), so that a recurrent-layers conversion imports nothing of it."""
