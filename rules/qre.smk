# One job per encoder: QRE features w.r.t. the unit base encoder, then one gathered matrix.
rule features:
    input:
        LAYOUT["pip"],
        "results/embeddings/{model}",  # U is derived from them (the PIP artifact stores no U)
    output:
        LAYOUT["features"],
    params:
        direction=config["qre"]["direction"],
        eps=config["qre"]["eps"],
    conda:
        "../envs/encmap.yaml"
    threads: 1
    log:
        "logs/features/{model}/{encoder}.log",
    script:
        "../scripts/features.py"


rule qre:
    input:
        FEATURES,
    output:
        features="results/features/qre.h5",
        metrics="results/features/metrics.json",
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/qre.log",
    script:
        "../scripts/qre.py"
