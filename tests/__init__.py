"""The test suite, one folder per area; shared fixtures in conftest.py."""
