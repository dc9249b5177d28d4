# One job per model: one forward pass yields every encoder variant (layers x poolings, output,
# truncations), written to results/embeddings/{model}/{encoder}.h5.
rule embed:
    input:
        **stage_input("embed"),
    output:
        **stage_output("embed"),
    params:
        n=config["sentences"]["n"],  # checked against the curated set
        spec=lambda wc: science_spec(config["models"][wc.model]),  # not its meta: no output depends on it
        device=config["embed"]["device"],
        degenerate=config["embed"]["degenerate"],
        forward=forward_settings(config["embed"]),  # deterministic kernels, token batches
        on_error=config["embed"]["on_error"],  # whether a failure stops the run: changes no output
    threads: lambda wc: job_threads(config["models"][wc.model])  # scaled down to --cores; 1 for one-core backends
    priority: 1  # before evaluate: a model the pipeline makes (distilled, trained) is then made here and reused there
    log:
        "logs/embed/{model}.log",
    resources:
        gpu=lambda wc: gpu_request(config["models"][wc.model], config["embed"]["device"]),  # a card of its own; 0 on the CPU
    run:
        from encmap.workflow.jobs import in_process

        in_process(SCRIPTS / "embed.py", input, output, params, wildcards, threads, log, resources)
