"""The ONNX Runtime engine (engine.py) and this machine's cache of ORT's optimized models."""
