# Every encoder's features stacked into the m x n feature matrix the map, pair and regression
# stages read; degenerate encoders (embed.degenerate: drop) and the encoders of models that failed
# (embed.on_error: skip) are left off here.
rule gather:
    input:
        **stage_input("gather"),
    output:
        **stage_output("gather"),
    params:
        meta={m: config["models"][m]["meta"] for m in MODELS},  # what the map shows of each model
    log:
        "logs/gather.log",
    run:
        from encmap.workflow.jobs import in_process

        in_process(SCRIPTS / "gather.py", input, output, params, wildcards, threads, log, resources)
