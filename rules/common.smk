from encmap.config import check_snakemake_config

# Validates every config file (duplicate keys too) and the merged config; fails before any job.
check_snakemake_config(config, workflow.configfiles)

MODELS = sorted(config["models"])
SET = config["sentences"]["set"]
SENTENCES = f"data/sentences/{SET}.txt"


wildcard_constraints:
    model="[a-z0-9][a-z0-9._-]*",
