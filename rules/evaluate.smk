# One job per model: every encoder of it scored on every task, from one forward pass over the
# tasks' texts (and MTEB tasks by name when evaluate.mteb.tasks is set, online).
rule evaluate:
    input:
        **stage_input("evaluate"),
    output:
        **stage_output("evaluate"),
    params:
        n=config["sentences"]["n"],  # checked against the curated set
        spec=lambda wc: science_spec(config["models"][wc.model]),  # not its meta: no output depends on it
        evaluate=config["evaluate"],
        degenerate=config["embed"]["degenerate"],
        forward=forward_settings(config["embed"]),  # the same forward pass as embed's
    conda:
        "../envs/encmap.yaml"
    threads: lambda wc: job_threads(config["models"][wc.model])  # scaled down to --cores; torch and the classifiers use exactly these
    log:
        "logs/evaluate/{model}.log",
    resources:
        gpu=lambda wc: gpu_request(config["models"][wc.model], config["evaluate"]["device"]),  # a card of its own; 0 on the CPU
    script:
        "../scripts/evaluate.py"
