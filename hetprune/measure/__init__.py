"""The measuring layer: timing, latency tables, and export to ONNX, INT8 and hub folders, each checked
in its runtime."""
