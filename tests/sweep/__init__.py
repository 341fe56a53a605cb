"""The bad-input sweep: every command given what a user gets wrong, one row per case (`cases.py`),
run in this process against shared inputs (`world.py`: one synthetic genome and its shards, a second
genome, a tiny trained run, its evals, a comparison and a report) and judged by `table.py`: the exit
status, one line on stderr naming the file or field and the fix, no traceback, nothing half-written.

    python -m tests.sweep [WORDS]    # every case (or those whose id holds WORDS): the table, and
                                     # benchmarks/results/sweep_cli.json
    pytest tests/sweep -m slow       # the same cases as tests
"""
