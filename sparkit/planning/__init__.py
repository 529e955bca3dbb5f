"""Planning, above the engines: rule assembly (rules) and compilation (compile) of a loaded recipe
into a LaunchPlan, orchestrating the engine adapters."""
