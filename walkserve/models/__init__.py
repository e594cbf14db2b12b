"""Model families: each a folder with its walk graph, components, weights loader and tiny-config maker."""
