"""The runtime: opens a bundle and generates. Imports no torch / transformers / optimum."""
