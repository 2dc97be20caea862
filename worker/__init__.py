"""The CoMERA worker: Celery tasks that run one training job attempt each.

``worker.celery_app`` builds the Celery app from :class:`service.store.settings.Settings`
(``celery -A worker.celery_app worker``); ``worker.tasks`` holds the one thin task; the logic
lives in plain functions (``worker.pipeline`` and its helpers), tested without Celery. Nothing
here imports torch at import time: the engine is imported inside the pipeline, in the child
process that runs the job.
"""
