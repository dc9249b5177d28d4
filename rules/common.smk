from encmap.config import LAYOUT, check_snakemake_config, expand_encoders

# Validates every config file (duplicate keys too) and the merged config; fails before any job.
check_snakemake_config(config, workflow.configfiles)

MODELS = sorted(config["models"])
# Every encoder id follows from params alone (`layers: all` states num_layers), so the DAG has
# one pip / features job per encoder from the start, no checkpoint needed.
ENCODERS = expand_encoders(config["models"])
SET = config["sentences"]["set"]
SENTENCES = f"data/sentences/{SET}.txt"


def per_encoder(pattern):
    """``pattern`` (with {model} and {encoder}) for every encoder of every model."""
    return [pattern.format(model=v.model, encoder=e) for e, v in sorted(ENCODERS.items())]


wildcard_constraints:
    model="[a-z0-9][a-z0-9._-]*",
    encoder="[a-z0-9][a-z0-9._-]*",
