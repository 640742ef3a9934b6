"""Shared test code, imported as ``tests.helpers.<module>`` (every test folder is a
package, so a fresh clone needs no path set): ``ledgers`` builds vak ledgers,
``storage`` the S3 and CLI helpers, ``http`` a scripted chat-completions server,
``compaction``, ``data_paths`` (where ``tests/data`` is) and ``fault_proxy``.
"""
