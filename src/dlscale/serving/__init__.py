"""Serving a trained model over HTTP: inputs checked from JSON, request statistics, the routes,
and the two engines behind them (a Ray Serve deployment; one plain process for comparison)."""
