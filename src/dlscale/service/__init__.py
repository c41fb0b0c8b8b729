"""The shared service (`dlscale serve`): tenants, their quotas and the fair-share scheduler."""
