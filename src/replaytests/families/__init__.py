"""Experiment families (SPEC §7): each turns rows of a bank into ledger records."""
