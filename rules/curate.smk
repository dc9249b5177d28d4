# The probe sentences: n sentences curated from the configured sources, seeded.
rule curate:
    output:
        txt=update(SENTENCES),
        manifest=update(f"data/sentences/{SET}.manifest.tsv"),
        sha=update(f"data/sentences/{SET}.sha256"),
        sources=update(f"data/sentences/{SET}.sources.tsv"),
    params:
        sentences=config["sentences"],
    conda:
        "../envs/encmap.yaml"
    log:
        f"logs/curate/{SET}.log",
    script:
        "../scripts/curate.py"
