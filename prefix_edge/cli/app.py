"""The typer app every verb's module (cli/<verb>.py) adds its command to."""

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain help: no markup eating "[ray]", no <bool> on flags
                  help="Run task-specialised language models with precomputed KV prefixes.")
