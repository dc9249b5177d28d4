# Shared declarations: the validated config, the models, and the per-encoder file lists. They
# decide which jobs exist; what a job writes is decided by its rule, script and step module.
from pathlib import Path

from encmap.encoders.embed import job_threads
from encmap.encoders.variants import science_spec
from encmap.integrity import for_snakemake, record_for_snakemake
from encmap.jobs import one_reevaluation_timer, replace_stale_backups
from encmap.layout import LAYOUT, artifact_paths, map_figures, similarity_figures
from encmap.params import check_snakemake_config
from encmap.validation import check_writable

# Snakemake 9 starts one more perpetual 1 s re-evaluation timer per finished job (the scheduler
# then burns a core on large maps and slows the running jobs): keep one (encmap.jobs).
one_reevaluation_timer()
# A killed job leaves its update() outputs' backups, and the next backup of them would fail.
replace_stale_backups()

# Validates every config file (duplicate keys too) and the merged config; fails before any job.
check_snakemake_config(config, workflow.configfiles)
# An artifact folder made read-only or immutable: named now, not in a traceback mid-run.
check_writable(workflow.basedir)

MODELS = sorted(config["models"])
# Rules with `run:` (embed, pip, features, gather) run their scripts/ adapter in Snakemake's own
# process (encmap.jobs.in_process, with force-use-threads in the profiles): a fresh interpreter per
# job cost ~1 s of CPU, most of the pipeline's time on many small encoders.
SCRIPTS = Path(workflow.basedir) / "scripts"
SET = config["sentences"]["set"]
SENTENCES = f"data/sentences/{SET}.txt"


# Every encoder id follows from params alone (`layers: all` states num_layers), so the DAG has
# one pip / features job per encoder from the start, no checkpoint needed.
PIPS = artifact_paths(config["models"], "pip")
FEATURES = artifact_paths(config["models"], "features")
# Every output of every rule is update(): Snakemake keeps it while the job runs (it would delete it
# when the job starts) and puts the previous one back if the job fails, so the results persist
# until a job that replaces them succeeds (each step writes its files atomically).
MAP_FIGURES = {k: update(v) for k, v in map_figures(config["map"]["fields"]).items()}
SIMILARITY_FIGURES = {k: update(v) for k, v in similarity_figures().items()}

# Artifacts changed behind the pipeline's back (a truncated file, an edited matrix): reported and
# moved aside before the DAG is built, so their jobs run again (encmap.integrity); every artifact
# is recorded when a run ends. Not under DVC, which hashes every output itself.
for_snakemake(workflow, [f"results/{kind}/{m}" for kind in ("embeddings", "eval") for m in MODELS])


onsuccess:
    record_for_snakemake(workflow)


onerror:
    record_for_snakemake(workflow)


wildcard_constraints:
    model="[a-z0-9][a-z0-9._-]*",
    encoder="[a-z0-9][a-z0-9._-]*",
