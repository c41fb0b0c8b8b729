"""Sweeps: many trainings of one spec (grid, random or TPE search, k-fold, ensembles)."""
