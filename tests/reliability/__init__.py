"""The reliability matrix (issue 7): one test module per fault or hostile input.

Each row's test names the promise it proves in ``docs/reliability.md``.
"""
