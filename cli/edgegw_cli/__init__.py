"""The ``edgegw`` command line (typer). One module per command."""
