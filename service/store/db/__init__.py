"""The SQL store: typed models (the schema's single source with ``migrations/``) and CRUD."""
