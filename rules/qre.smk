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
    threads: 1
    log:
        "logs/features/{model}/{encoder}.log",
    run:
        in_process(SCRIPTS / "features.py", input, output, params, wildcards, threads, log, resources)


rule qre:
    input:
        FEATURES,
    output:
        features="results/features/qre.h5",
        metrics="results/features/metrics.json",
    log:
        "logs/qre.log",
    run:
        in_process(SCRIPTS / "qre.py", input, output, params, wildcards, threads, log, resources)
