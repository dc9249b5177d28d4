"""Encoders: the variants a model yields (``variants``), embedding sentences with every backend
(``embed``; one module per backend in ``backends``), model files and provenance (``checkpoints``)."""
