# The map: t-SNE coordinates, neighbours, figures, the interactive page (both layouts, hover scores
# from the regression), faithfulness metrics
# (which compare the map with the exact pairwise QRE of rules/pairwise.smk).
rule map:
    input:
        features="results/features/qre.h5",
        pairwise="results/similarity/qre_pairwise.h5",
        predictions="results/regression/predictions.csv",  # hover: measured and predicted scores
    output:
        coords=update("results/map/coords.csv"),
        neighbours=update("results/map/neighbours.csv"),
        html=update("results/map/map.html"),
        model=update("results/map/model.h5"),
        metrics=update("results/map/metrics.json"),
        timing=update("results/map/timing.json"),
        **MAP_FIGURES,
    params:
        map=config["map"],
        predictor=config["regress"]["predictor"],  # whose held-out predictions the page shows
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/map.log",
    script:
        "../scripts/map.py"
