"""What a run leaves: the ledger, run directories, the audit, reports, compare, history,
summary, statistics and the verdict. Never imports the engine."""
