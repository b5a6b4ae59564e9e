"""Helpers shared by test modules (imported as tests.helpers.*; no fixtures here)."""
