"""The workflow's plumbing, apart from the science: which stages there are and what each runs
(the stage registry, ``dvc.yaml`` generated from it), where artifacts live, code digests and
params slices (what makes a stage stale), ``encmap repro`` / ``encmap stage`` (DVC decides,
Snakemake runs), the ledger of damaged artifacts, and running jobs inside Snakemake's process.
Nothing in ``encmap.qre``, ``encmap.similarity``, ``encmap.maps`` or ``encmap.downstream``
imports it."""
