"""One module per measured performance claim: ``python -m benchmarks.<name> [--quick]``.

Each measures ours and the baseline side by side in one process and ends with one line
``RESULT <name> <value> goal <op> <target>``. See benchmarks/README.md.
"""
