"""Helpers shared by several test modules, each defined once (tests/test_helpers.py):
`cli.ccbench` (the command line in a subprocess), `rows.harness_row` (a harness CSV row
of known values) and `drivers` (a case driver's named checks). The fixture every module
on the device double uses, `fresh_counts`, is in tests/conftest.py."""
