# The offline evaluation tasks, built once (probe sentences removed, counted per task).
rule tasks:
    input:
        **stage_input("tasks"),
    output:
        **stage_output("tasks"),
    params:
        n=config["sentences"]["n"],  # checked against the curated set
        evaluate=config["evaluate"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/tasks.log",
    script:
        "../scripts/tasks.py"
