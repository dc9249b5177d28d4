from pathlib import Path

from encmap.config import LAYOUT, artifact_paths, check_snakemake_config, map_figures, similarity_figures
from encmap.pipeline.jobs import in_process

# Validates every config file (duplicate keys too) and the merged config; fails before any job.
check_snakemake_config(config, workflow.configfiles)

MODELS = sorted(config["models"])
# The per-model and per-encoder rules (embed, pip, features, qre) run their scripts/ adapter in
# Snakemake's own process (`run:` + force-use-threads in the profiles): a fresh interpreter per
# job cost ~1 s of CPU, most of the pipeline's time on many small encoders (encmap.pipeline.jobs).
SCRIPTS = Path(workflow.basedir) / "scripts"
SET = config["sentences"]["set"]
SENTENCES = f"data/sentences/{SET}.txt"


# Every encoder id follows from params alone (`layers: all` states num_layers), so the DAG has
# one pip / features job per encoder from the start, no checkpoint needed.
PIPS = artifact_paths(config["models"], "pip")
FEATURES = artifact_paths(config["models"], "features")
MAP_FIGURES = map_figures(config["map"]["fields"])
SIMILARITY_FIGURES = similarity_figures()


wildcard_constraints:
    model="[a-z0-9][a-z0-9._-]*",
    encoder="[a-z0-9][a-z0-9._-]*",
