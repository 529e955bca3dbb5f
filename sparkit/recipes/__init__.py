"""Recipes: schema (pydantic), loading (extends, --set), rules, and compilation to a LaunchPlan."""
