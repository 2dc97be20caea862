"""The CoMERA service: the FastAPI app and the shared job store (``service.store``); no torch."""
