# The probe sentences: n sentences curated from the configured sources, seeded.
rule curate:
    input:
        **stage_input("curate"),
    output:
        **stage_output("curate"),
    params:
        sentences=config["sentences"],
    conda:
        "../envs/encmap.yaml"
    log:
        f"logs/curate/{config['sentences']['set']}.log",
    script:
        "../scripts/curate.py"
