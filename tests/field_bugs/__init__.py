"""Real attention bugs from public trackers, replayed on tiny random models, that the property suite must catch.

``catalogue.BUGS`` lists them; ``python -m tests.field_bugs`` prints the bug x property matrix and
``--write-docs docs/field-bugs.md`` regenerates the page. See tests/test_field_bugs.py for the tiers.
"""
