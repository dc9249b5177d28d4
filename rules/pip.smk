# One job per encoder: the factored PIP of results/embeddings/{model}/{encoder}.h5.
rule pip:
    input:
        "results/embeddings/{model}",
    output:
        LAYOUT["pip"],
    params:
        tol=config["pip"]["tol"],
        dense_max_n=config["pip"]["dense_max_n"],
        center=config["pip"]["center"],
        normalize_rows=config["pip"]["normalize_rows"],
    conda:
        "../envs/encmap.yaml"
    threads: 2  # BLAS threads of the SVD
    log:
        "logs/pip/{model}/{encoder}.log",
    script:
        "../scripts/pip.py"
