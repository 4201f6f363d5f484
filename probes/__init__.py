"""Head redundancy probes (importance, pruning curves, similarity, roles). See the Probes issue."""
