"""kolo's sweeps and reports: sweep files and their runner, the results CSV, plots, the HTML
report and the scaling-efficiency regression gate. Command lines: scripts/sweep, scripts/report,
scripts/check-regression (reports.cli)."""
