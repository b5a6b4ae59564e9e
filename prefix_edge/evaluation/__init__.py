"""`prefix-edge eval`: score a bundle's task on example lines (metrics.py), through the bundle on
each backend (run.py) and, with the export extra, through fp32 transformers + PEFT (reference.py)."""
