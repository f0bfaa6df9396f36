"""The command line, its registries and plugins, the import graph, the demo."""
