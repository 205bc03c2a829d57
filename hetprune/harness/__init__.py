"""The harness layer: the library's entry points (prune, compare, ablate) and the conformance kit."""
