"""One function per pipeline step: read inputs, call the maths, write artifacts atomically.

``scripts/*.py`` are thin adapters that pass Snakemake's inputs, outputs and params to a step
here. One module per stage group, imported directly (``encmap.pipeline.backbone``,
``encmap.pipeline.mapping``, ``encmap.pipeline.place``), so a DVC stage depends only on the
modules on its own path.
"""
