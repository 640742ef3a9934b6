"""Contract suites: the tests every implementation of an extension point runs.

As fsspec's ``tests/abstract``: a base class per extension point holds the tests (its
name does not start with ``Test``, so it is never collected alone); each implementation's
test module subclasses it with a fixture that gives the implementation. A new transcript
format, summariser or price source gets the whole contract by one subclass.

* :class:`tests.contracts.formats.FormatContract`: ``pipeline.formats`` adapters
  (``tests/unit/formats/test_format_contract.py``);
* :class:`tests.contracts.summarisers.SummariserContract`: ``pipeline.compaction``
  summarisers (``tests/unit/compaction/test_summariser_contract.py``);
* :class:`tests.contracts.prices.PriceSourceContract`: the layers of
  ``pipeline.costs.pricing`` (``tests/unit/costs/test_price_source_contract.py``).
"""
