# Every encoder's features stacked into the m x n feature matrix the map, pair and regression
# stages read; degenerate encoders (embed.degenerate: drop) are left off here.
rule gather:
    input:
        FEATURES,
    output:
        features="results/features/qre.h5",
        metrics="results/features/metrics.json",
    log:
        "logs/gather.log",
    run:
        from encmap.jobs import in_process

        in_process(SCRIPTS / "gather.py", input, output, params, wildcards, threads, log, resources)
