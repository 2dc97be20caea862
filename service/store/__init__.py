"""The job store the API and the worker share: settings, the SQL layer (``db``), API key
format and scopes, the queue client and placement, ids, the spec hash, artifact files, the model
source check and the reaper.

Nothing here imports the web app (FastAPI, Starlette, ``service`` outside ``service.store``);
the worker imports nothing of ``service`` but this package (``tests/test_layering.py``).
"""
