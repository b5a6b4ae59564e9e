"""Turning a step's logits into a request's text: sampling.py (penalties, samplers, log-
probabilities), constraint.py (JSON schema / regex / Lark grammar -> token masks, llguidance),
text.py (incremental detokenization, stop strings). No engine, cache or scheduler here: the
scheduler calls these per token."""
