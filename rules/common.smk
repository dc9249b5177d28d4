# Shared declarations: the validated config, the models, and each stage's inputs and outputs from
# the stage registry (src/encmap/workflow/stages.py, which dvc.yaml is generated from too). They
# decide which jobs exist; what a job writes is decided by its script and step module.
from pathlib import Path

from encmap.device import set_gpu_limit
from encmap.encoders.embed import forward_settings, gpu_request, job_threads
from encmap.encoders.variants import science_spec
from encmap.validation import check_writable
from encmap.workflow.config import check_snakemake_config
from encmap.workflow.deps import code_key
from encmap.workflow.integrity import for_snakemake, record_for_snakemake
from encmap.workflow.jobs import code_loaded, receipts_follow_touch
from encmap.workflow.jobs import keep_update_outputs_of_failed_jobs, one_reevaluation_timer, replace_stale_backups
from encmap.workflow.made import record_made
from encmap.workflow.stages import STAGES, all_targets, source_inputs

# Snakemake 9 starts one more perpetual 1 s re-evaluation timer per finished job (the scheduler
# then burns a core on large maps and slows the running jobs): keep one (encmap.workflow.jobs).
one_reevaluation_timer()
# A killed job leaves its update() outputs' backups, and the next backup of them would fail.
replace_stale_backups()
# A failed job under SLURM has no backup in this process: its previous outputs are kept, not deleted.
keep_update_outputs_of_failed_jobs()
# The code as this process loaded it: an in-process job's receipt names what changed since; and
# Snakemake's touch of a job's outputs keeps their receipts (encmap.workflow.receipts).
code_loaded(workflow.basedir)
receipts_follow_touch()
# Each finished job's outputs and what they were made from (code, params, inputs): `encmap record`
# then records a plain run's results in dvc.lock (encmap.workflow.made).
record_made(workflow)

# Validates every config file (duplicate keys too) and the merged config; fails before any job.
check_snakemake_config(config, workflow.configfiles)
# An artifact folder made read-only or immutable: named now, not in a traceback mid-run.
check_writable(workflow.basedir)

# The GPUs found (ENCMAP_GPUS, CUDA_VISIBLE_DEVICES or the driver's list) are the `gpu` resource
# limit unless --resources gives one: never more GPU jobs at once than cards, each on its own
# (encmap.device.job_device). No CUDA GPU: no limit, as before.
set_gpu_limit(workflow)

MODELS = sorted(config["models"])
# Rules with `run:` (embed, pip, features, gather) run their scripts/ adapter in Snakemake's own
# process (encmap.workflow.jobs.in_process, with force-use-threads in the profiles): a fresh
# interpreter per job cost ~1 s of CPU, most of the pipeline's time on many small encoders.
SCRIPTS = Path(workflow.basedir) / "scripts"


def stage_input(name):
    """The rule's inputs, as the stage registry names them, and the files params name for it (its
    sources: an edited corpus remakes the sentences and all that follows, as DVC decides)."""
    return STAGES[name].inputs(config) | source_inputs(name, config)


def stage_output(name):
    """The rule's outputs, as the stage registry names them. Every one is update(): Snakemake
    keeps it while the job runs (it would delete it when the job starts) and puts the previous one
    back if the job fails, so the results persist until a job that replaces them succeeds."""
    st = STAGES[name]
    return {k: update(directory(v) if k in st.directories else v) for k, v in st.outputs(config).items()}


def stage_code(name):
    """sha256 of the code the stage runs (its digest): what keys the pairs a pair stage reuses.
    A function of the job, so that only a run that has the stage's jobs computes it."""
    return lambda wildcards: code_key(workflow.basedir, name)


# Artifacts changed behind the pipeline's back (a truncated file, an edited matrix): reported
# before the DAG is built and their jobs run again (encmap.workflow.integrity); every artifact is
# recorded when a run ends. Not under DVC, which hashes every output itself.
for_snakemake(workflow, [f"results/{kind}/{m}" for kind in ("embeddings", "eval") for m in MODELS])


onsuccess:
    record_for_snakemake(workflow)


onerror:
    record_for_snakemake(workflow)


wildcard_constraints:
    model="[a-z0-9][a-z0-9._-]*",
    encoder="[a-z0-9][a-z0-9._-]*",
