"""The containers, one family per sub-folder (:mod:`rnnconvert.engine.registry` lists them;
docs/architecture.md)."""
