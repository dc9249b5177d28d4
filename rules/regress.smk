# Predict every task's main score from the QRE features: ElasticNet on PCA and ridge, grouped
# (leave-one-model-out) vs random CV, against baselines; the fitted regressors serve `encmap place`.
rule regress:
    input:
        **stage_input("regress"),
    output:
        **stage_output("regress"),
    params:
        regress=config["regress"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # scaled down to --cores: worker processes for the fits, one BLAS thread each
    log:
        "logs/regress.log",
    script:
        "../scripts/regress.py"
