# The probe sentences: n sentences curated from the configured sources, seeded.
rule curate:
    output:
        txt=SENTENCES,
        manifest=f"data/sentences/{SET}.manifest.tsv",
        sha=f"data/sentences/{SET}.sha256",
        sources=f"data/sentences/{SET}.sources.tsv",
    params:
        sentences=config["sentences"],
    conda:
        "../envs/encmap.yaml"
    log:
        f"logs/curate/{SET}.log",
    script:
        "../scripts/curate.py"
