"""`prefix-edge eval`: score a bundle's task on example lines (metrics.py), through the bundle on
each backend (run.py); with the export extra, eval --reference scores the fp32 transformers + PEFT
reference too (tune/reference.py)."""
