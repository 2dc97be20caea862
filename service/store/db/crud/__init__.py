"""Keyword-only data access functions, one module per resource."""
