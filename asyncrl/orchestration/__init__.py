"""The orchestration: the controller that places the actor pools, runs the step loop and coordinates weight
syncs. It stands on the actors and the core; only the entry point (`python -m asyncrl.run`) is above it."""
