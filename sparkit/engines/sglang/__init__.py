"""SGLang: the adapter (compile + feature detection) and the plugin that runs inside sglang."""
