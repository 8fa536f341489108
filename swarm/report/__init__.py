"""`skippipe report`: a finished (or running) run directory read back into plots and a one-page HTML report.

Pure file reading: nothing here imports hivemind, libp2p or torch, and matplotlib only when a plot is drawn.
- run_dir.py: read_run, RunData, IterationRecord, NotARunError: metrics, schedules, events and names, checked
- traces.py: read_traces, Traces, Span: the peers' timelines, per-iteration windows, busy/averaging/idle seconds
- json_lines.py: read_json_lines, LineCounter: JSON lines from untrusted files, malformed ones skipped and counted
- plots.py: the PNGs (loss, tokens/s, iteration time measured vs planned, busy/idle, measured and planned Gantt)
- summary.py: summarize, the summary table's rows
- page.py: render_page, the self-contained HTML page
- write.py: write_report, Report, ReportError: the one entry point the command calls
"""
