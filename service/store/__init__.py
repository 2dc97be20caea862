"""The job store the API and the worker share: settings, the SQL layer (``db``), API key
format and scopes, the queue client and placement, ids, the spec hash, artifact files, the model
source check and the reaper.

Nothing here imports the web app (FastAPI, Starlette, ``service`` outside ``service.store``);
the worker imports nothing of ``service`` but this package and the workers' remote control
(``service.task_control``, which its beat task passes to the reaper); the store keeps only that
control's interface (``service.store.reaper.TaskControl``) and never imports it
(``tests/test_layering.py``).
"""
