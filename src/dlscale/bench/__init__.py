"""`dlscale bench`: measure this machine, and rerun the field's classic scaling experiments.

Each bench is a pure measurement function returning a JSON-ready dict (`run_machine_bench`,
`run_matmul_bench`, `run_loader_bench`, `run_width_bench`); `output.py` turns results into JSON
and PNG files, and `dlscale.cli.bench` into tables.
"""
