"""The service's HTTP routes, thin: each declares the access it needs (service/deps.py), parses
its request, and calls the store, the job store, the submission service, the job folder or
dlscale.api."""
