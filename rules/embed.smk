rule embed:
    input:
        SENTENCES,
    output:
        directory("results/embeddings/{model}"),
    params:
        spec=lambda wc: config["models"][wc.model],
        device=config["embed"]["device"],
    log:
        "logs/embed/{model}.log",
    resources:
        gpu=lambda wc: int(config["models"][wc.model]["backend"] in ("sentence-transformers", "transformers")),
    script:
        "../scripts/embed.py"
