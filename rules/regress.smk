# Predict every task's main score from the QRE features: ElasticNet on PCA and ridge, grouped
# (leave-one-model-out) vs random CV, against baselines; the fitted regressors serve `encmap place`.
rule regress:
    input:
        features="results/features/qre.h5",
        evals=expand("results/eval/{model}", model=MODELS),
        tables=[t["path"] for t in config["regress"]["score_tables"]],
        # published MTEB scores read from a local copy of MTEB's results (regress.mteb.results)
        mteb=[r for r in [config["regress"]["mteb"]["results"]] if r not in (None, "remote")],
    output:
        metrics=update("results/regression/metrics.json"),
        table=update("results/regression/table.csv"),
        predictions=update("results/regression/predictions.csv"),
        scores=update("results/regression/scores.csv"),
        regressors=update("results/regression/regressors.h5"),
        failures=update("results/regression/failures.json"),  # every model that failed (embed or evaluate, on_error: skip)
        mteb_scores=update("results/regression/mteb_scores.csv"),  # published MTEB targets (regress.mteb), encoder,task,score
        mteb_sources=update("results/regression/mteb_sources.json"),  # where each comes from; what is missing and why
        figure_png=update("results/regression/figures/predicted.png"),
        figure_svg=update("results/regression/figures/predicted.svg"),
        baselines_png=update("results/regression/figures/baselines.png"),  # Spearman of every feature set, per task
        baselines_svg=update("results/regression/figures/baselines.svg"),
    params:
        regress=config["regress"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # scaled down to --cores: worker processes for the fits, one BLAS thread each
    log:
        "logs/regress.log",
    script:
        "../scripts/regress.py"
