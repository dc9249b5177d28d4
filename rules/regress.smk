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
        metrics="results/regression/metrics.json",
        table="results/regression/table.csv",
        predictions="results/regression/predictions.csv",
        scores="results/regression/scores.csv",
        regressors="results/regression/regressors.h5",
        failures="results/regression/failures.json",  # every model that failed (embed or evaluate, on_error: skip)
        mteb_scores="results/regression/mteb_scores.csv",  # published MTEB targets (regress.mteb), encoder,task,score
        mteb_sources="results/regression/mteb_sources.json",  # where each comes from; what is missing and why
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
