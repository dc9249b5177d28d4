"""The map of encoders: distances and neighbours, t-SNE, how faithful the map is, the metadata
fields it shows, its figures and the interactive page."""
