"""Accuracy evaluations (GSM8K) and their statistics. Pure data in, data out; never prints."""
