"""Ray actors: thin classes that move data and call asyncrl/ and algorithms/.

Each is a plain class; `ray.remote` is applied when the controller spawns it,
so tests can also run them in-process.
"""
