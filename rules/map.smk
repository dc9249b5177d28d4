# The map: t-SNE coordinates, neighbours, figures, the interactive page (both layouts, hover scores
# from the regression), faithfulness metrics
# (which compare the map with the exact pairwise QRE of rules/pairwise.smk).
rule map:
    input:
        **stage_input("map"),
    output:
        **stage_output("map"),
    params:
        map=config["map"],
        predictor=config["regress"]["predictor"],  # whose held-out predictions the page shows
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/map.log",
    script:
        "../scripts/map.py"
