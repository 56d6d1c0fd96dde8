"""Must-fail controls: each fault a check exists to find, injected on this platform in this run, and the
check shown to find it, beside the same check passing without it (`replaytests selftest`, docs/ci.md).

matrix.py is the result (no torch); faults.py the faults; trials.py each fault against its check;
command.py the command.
"""
