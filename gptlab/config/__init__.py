"""Composed Hydra config -> typed settings and built objects: build, schema, settings, validate, no-op checks, resolvers,
and a trained run rebuilt from its saved config (trained)."""
