"""The ``relyscope`` command line (typer + rich)."""
