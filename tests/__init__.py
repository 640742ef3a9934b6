"""vakpipe's tests: ``unit/<package>``, ``integration``, ``reliability``, ``deploy``,
``project``; shared code in ``helpers``, contract suites in ``contracts`` (README.md,
"Development")."""
