"""CLI subcommands, one module each (see :mod:`foresight.cli`)."""
