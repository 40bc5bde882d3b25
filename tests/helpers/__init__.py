"""Helpers shared by several test modules, each defined once (tests/test_helpers.py):

- `cli`: `ccbench(...)`, the command line in a subprocess; `parse_osu`, OSU's table read
  as OSU's own parsers do;
- `repo`: `git(...)` and `interruptible` (a child that Ctrl-C reaches);
- `rows`: `harness_row(...)`, a harness CSV row of known values;
- `drivers`: a case driver's checks by name (`case_line`, `on_every_rank`) and what a
  test asserts of them (`failed_checks`);
- `codec_data`: the codecs under test, their round trips and hypothesis's inputs.

The fixtures several modules use, `fresh_counts` and `clone`, are in tests/conftest.py."""
