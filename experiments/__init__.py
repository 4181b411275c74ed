"""Experiment runners, each a `python -m experiments.<name>` entry point."""
