"""The probe sentences: corpus readers (Wikipedia, WordNet, Brown, user files, hub datasets),
cleaning and filters, and the stratified curation of the fixed sentence set."""
