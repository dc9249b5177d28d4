# encmap: a map of sentence encoders. This file is a table of contents: the rules live in
# rules/*.smk, the logic in src/encmap/. params.yaml is both this workflow's config and DVC's
# params file; it is validated against schemas/params.schema.json before any job starts.

configfile: "params.yaml"


include: "rules/common.smk"
include: "rules/curate.smk"
include: "rules/embed.smk"
include: "rules/pip.smk"
include: "rules/qre.smk"
include: "rules/similarity.smk"
include: "rules/map.smk"
include: "rules/evaluate.smk"


rule all:
    input:
        SENTENCES,
        expand("results/embeddings/{model}", model=MODELS),
        PIPS,
        "results/features/qre.h5",
        "results/map/map.html",
        "results/similarity/metrics.json",
        "results/regression/metrics.json",
        "results/regression/regressors.h5",  # what `encmap place` predicts scores with
