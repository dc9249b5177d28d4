rule features:
    input:
        "results/pip/{model}",
    output:
        directory("results/features/encoders/{model}"),
    params:
        direction=config["qre"]["direction"],
        eps=config["qre"]["eps"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/features/{model}.log",
    script:
        "../scripts/features.py"


rule qre:
    input:
        expand("results/features/encoders/{model}", model=MODELS),
    output:
        features="results/features/qre.h5",
        metrics="results/features/metrics.json",
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/qre.log",
    script:
        "../scripts/qre.py"
