"""The command line: thin Typer commands over dlscale.api."""
