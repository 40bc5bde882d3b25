"""ccbench plotting stage: redraws the seed papers' figures from result CSVs only.

Run it as `ccbench plot RESULTS... -o OUTDIR` or `python -m ccbench.plots RESULTS... -o OUTDIR`.
"""
