"""Reading run directories back (runs.py) and the wandb dashboard (dashboard.py). Built on the core only; the
CLIs `python -m asyncrl.inspect` and `python -m asyncrl.plot`, the notebook and the controller's verdict use it."""
