"""Engine adapters (sglang, embedded) and the activation report they share."""
