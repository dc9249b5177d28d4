"""Encoders: the variants a model yields (``variants``), embedding sentences with every backend
(``embed``; one module per backend in ``backends``; what the served backend ``openai`` needs besides
the protocol in ``served``), model files and provenance (``checkpoints``)."""
