"""The `foresight` subcommands this package adds to the command line, one module each, registered as
``foresight.commands`` entry points (``pyproject.toml``; :mod:`foresight.plugins`)."""
