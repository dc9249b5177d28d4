# Every encoder's features stacked into the m x n feature matrix the map, pair and regression
# stages read; degenerate encoders (embed.degenerate: drop) and the encoders of models that failed
# (embed.on_error: skip) are left off here.
rule gather:
    input:
        FEATURES,
    output:
        features="results/features/qre.h5",
        metrics="results/features/metrics.json",
        failures="results/features/failures.json",  # models that failed under embed.on_error: skip
    log:
        "logs/gather.log",
    run:
        from encmap.jobs import in_process

        in_process(SCRIPTS / "gather.py", input, output, params, wildcards, threads, log, resources)
