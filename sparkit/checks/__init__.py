"""Checks: preflight (plan + host, before launch) and activation (live server, after launch)."""
