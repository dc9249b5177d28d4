"""The Snakemake route's check of the config it loaded (``rules/common.smk``), before any job.

Plumbing above :mod:`encmap.params`: the params rules live there; what is checked once per
config and code (a marker under ``.snakemake/encmap``) is decided here, with the import analysis
of :mod:`encmap.workflow.deps`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import params
from .deps import module_files


def check_snakemake_config(config: dict, configfiles: list) -> None:
    """Validate the config Snakemake loaded: each file for duplicate keys, then the merge.

    A JSON rendering of params.yaml (:func:`encmap.params.snakemake_configfile`) is named, and was checked, as
    the YAML file it renders.
    """
    names = [params._RENDERED_FROM.get(str(f), str(f)) for f in configfiles]
    for f in names:
        params.check_yaml_file(f)
    validate_once(config, "config (" + ", ".join(names) + ")")


def validate_once(config: dict, where: str) -> None:
    """:func:`encmap.params.validate_params` and the MTEB targets' check of ``config`` (errors name
    ``where``), skipped where this code already found this config valid: ``encmap stage`` and the
    Snakemake process it starts check the same params of every stage DVC runs (0.75 s at 1,101
    models, and jsonschema's import). The marker's name hashes the config and the code."""
    marker = params.RENDERED / f"valid-{_validation_key(config)}"
    if marker.exists():
        return
    params.validate_params(config, where)
    params.check_mteb_targets(config, where)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def _validation_key(config: dict) -> str:
    """sha256 of a config and of everything that decides whether it is valid: the schema and every
    file :func:`validate_params` can run (the import analysis that digests the stages' code)."""
    import hashlib

    h = hashlib.sha256(json.dumps(config, sort_keys=True, allow_nan=True, default=str).encode())
    schema_file = Path(params.__file__).with_name("params.schema.json")
    for f in [schema_file, *module_files("encmap.params", "validate_params"),
              *module_files("encmap.params", "check_mteb_targets")]:
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:32]
