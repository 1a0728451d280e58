"""Shared pytest fixtures. Helpers add fixtures for their area below with small edits."""

from __future__ import annotations
