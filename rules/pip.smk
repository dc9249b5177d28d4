rule pip:
    input:
        "results/embeddings/{model}",
    output:
        directory("results/pip/{model}"),
    params:
        tol=config["pip"]["tol"],
        dense_max_n=config["pip"]["dense_max_n"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/pip/{model}.log",
    script:
        "../scripts/pip.py"
