"""The service's HTTP routes, thin: each checks access through service/deps.py and calls the
store, the job folder or dlscale.api."""
