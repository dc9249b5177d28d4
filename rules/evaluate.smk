# Downstream scores and their regression on the map's features. `tasks`: the offline evaluation
# tasks, built once (probe sentences removed). `evaluate`: one job per model scores all of its
# encoders (one forward pass over every task's texts). `regress`: grouped vs random CV of
# ElasticNet-on-PCA and ridge against baselines; the fitted regressors serve `encmap place`.
rule tasks:
    input:
        SENTENCES,
    output:
        "data/eval/tasks.json",
    params:
        evaluate=config["evaluate"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/tasks.log",
    script:
        "../scripts/tasks.py"


rule evaluate:
    input:
        tasks="data/eval/tasks.json",
        sentences=SENTENCES,
    output:
        directory("results/eval/{model}"),
    params:
        spec=lambda wc: config["models"][wc.model],
        evaluate=config["evaluate"],
        degenerate=config["embed"]["degenerate"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # scaled down to --cores; torch and the classifiers use exactly these
    log:
        "logs/evaluate/{model}.log",
    resources:
        gpu=lambda wc: int(config["models"][wc.model]["backend"] in ("sentence-transformers", "transformers")),
    script:
        "../scripts/evaluate.py"


rule regress:
    input:
        features="results/features/qre.h5",
        evals=expand("results/eval/{model}", model=MODELS),
        tables=[t["path"] for t in config["regress"]["score_tables"]],
    output:
        metrics="results/regression/metrics.json",
        table="results/regression/table.csv",
        predictions="results/regression/predictions.csv",
        scores="results/regression/scores.csv",
        regressors="results/regression/regressors.h5",
        figure_png="results/regression/figures/predicted.png",
        figure_svg="results/regression/figures/predicted.svg",
    params:
        regress=config["regress"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # scaled down to --cores: worker processes for the fits, one BLAS thread each
    log:
        "logs/regress.log",
    script:
        "../scripts/regress.py"
