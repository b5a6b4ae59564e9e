"""Making a task better: `prefix-edge train` (PEFT adapters on example pairs) and `prefix-edge
distill` (a teacher's answers as training data), and the fp32 reference `prefix-edge eval
--reference` scores (reference.py). Export-only dependencies (torch, transformers,
peft), imported by the CLI verbs when run."""
