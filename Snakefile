# encmap: a map of sentence encoders. This file is a table of contents: one rule per file in
# rules/, each running scripts/<rule>.py, a thin adapter for encmap.pipeline.<rule> (the logic
# lives in src/encmap/); each rule's inputs and outputs come from the stage registry
# (src/encmap/workflow/stages.py), which dvc.yaml is generated from. params.yaml is both this
# workflow's config and DVC's params file; it is validated against src/encmap/params.schema.json
# before any job starts.

from encmap.params import snakemake_configfile

# params.yaml, parsed once (a syntax error or a duplicate key names its line, which Snakemake's own
# message does not) and handed to Snakemake as JSON, which it reads ~100x faster than YAML.
configfile: snakemake_configfile("params.yaml")


include: "rules/common.smk"
include: "rules/curate.smk"     # probe sentences
include: "rules/embed.smk"      # one forward pass per model: every encoder variant
include: "rules/pip.smk"        # per encoder: exact factored PIP
include: "rules/features.smk"   # per encoder: QRE features w.r.t. the unit base encoder
include: "rules/gather.smk"     # the m x n feature matrix
include: "rules/pairwise.smk"   # exact QRE and linear CKA of every pair
include: "rules/cka_rbf.smk"    # RBF CKA over the subset
include: "rules/stitch.smk"     # stitches over the subset
include: "rules/agreement.smk"  # how the pair measures agree; heatmaps
include: "rules/map.smk"        # t-SNE map, neighbours, figures, page, faithfulness
include: "rules/tasks.smk"      # offline evaluation tasks
include: "rules/evaluate.smk"   # per model: downstream scores of every encoder
include: "rules/regress.smk"    # predicting scores from the features


# Every artifact of every stage (from the stage registry), so that one that is missing is always
# made again: Snakemake does not remake a missing intermediate file. regressors.h5 is what
# `encmap place` predicts scores with.
rule all:
    input:
        all_targets(config),
