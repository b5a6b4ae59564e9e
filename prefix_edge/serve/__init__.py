"""`prefix-edge serve`: the OpenAI-compatible local server (optional extra: prefix-edge[serve])."""
