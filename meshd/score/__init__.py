"""Scoring: rank a request's targets, admit or shed it, and choose when to hedge (sans-I/O)."""
