# One job per encoder: the exact factored PIP of results/embeddings/{model}/{encoder}.h5.
rule pip:
    input:
        **stage_input("pip"),
    output:
        **stage_output("pip"),
    params:
        tol=config["pip"]["tol"],
        dense_max_n=config["pip"]["dense_max_n"],
        center=config["pip"]["center"],
        normalize_rows=config["pip"]["normalize_rows"],
    threads: 1  # in-process jobs run BLAS on one thread each, side by side (encmap.workflow.jobs)
    log:
        "logs/pip/{model}/{encoder}.log",
    run:
        from encmap.workflow.jobs import in_process

        in_process(SCRIPTS / "pip.py", input, output, params, wildcards, threads, log, resources)
