# The offline evaluation tasks, built once (probe sentences removed, counted per task).
rule tasks:
    input:
        SENTENCES,
    output:
        update("data/eval/tasks.json"),
    params:
        n=config["sentences"]["n"],  # checked against the curated set
        evaluate=config["evaluate"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/tasks.log",
    script:
        "../scripts/tasks.py"
