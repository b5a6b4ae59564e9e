"""The runtime's caches: loaded task prefixes (prefixes.py) and the KV of prompts already read
(prompts.py, with its optional files on disk: prompt_files.py). Each is byte- or count-bounded,
and a hit gives the tokens of a miss."""
