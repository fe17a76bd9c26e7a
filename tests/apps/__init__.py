"""Small importable handler modules for `--app MODULE:ATTR` in the worker and CLI tests."""
