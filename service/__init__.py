"""The CoMERA service: FastAPI app, SQL store and settings (no torch here)."""
