rule embed:
    input:
        SENTENCES,
    output:
        directory("results/embeddings/{model}"),
    params:
        spec=lambda wc: config["models"][wc.model],
        device=config["embed"]["device"],
        degenerate=config["embed"]["degenerate"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # scaled down to --cores; torch uses exactly these
    log:
        "logs/embed/{model}.log",
    resources:
        gpu=lambda wc: int(config["models"][wc.model]["backend"] in ("sentence-transformers", "transformers")),
    script:
        "../scripts/embed.py"
