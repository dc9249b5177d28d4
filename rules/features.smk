# One job per encoder: QRE features w.r.t. the unit base encoder, one value per sentence.
rule features:
    input:
        **stage_input("features"),
    output:
        **stage_output("features"),
    params:
        direction=config["qre"]["direction"],
        eps=config["qre"]["eps"],
    threads: 1
    log:
        "logs/features/{model}/{encoder}.log",
    run:
        from encmap.workflow.jobs import in_process

        in_process(SCRIPTS / "features.py", input, output, params, wildcards, threads, log, resources)
