"""jobspool's benchmark harness (issue 6): run by hand, never as a timed test.

``python -m bench`` (or ``bench/run.sh``, which builds its own virtualenv with the
peers from PyPI) measures jobspool against the bare filesystem operations a job's
life needs and against its peers, interleaved round by round on the same disk,
and writes ``bench/results/<date>.json`` and ``.md``. See ``bench/README.md``.
"""
