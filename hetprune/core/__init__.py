"""The core layer: errors, settings, files, keys, the plugin registry and its contract, devices and ranks.
Nothing here imports from a layer above it (tests/test_layers.py)."""
