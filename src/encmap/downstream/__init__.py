"""Downstream scores and predicting them: the offline tasks, MTEB's metrics, MTEB tasks by name,
score tables from elsewhere, and the regression of scores on the QRE features."""
