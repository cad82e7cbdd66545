"""Benchmarks: aioloader against its peers (array_record, Grain), side by side in one run.

Run `python -m benchmarks run [--quick] [--only NAME]`; the protocol (ratios measured in the same
run, alternating runs, min/median/max over repeats) is in `benchmarks/common.py`.
"""
