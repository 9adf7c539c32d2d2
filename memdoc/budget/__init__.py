"""Memory budgets: a run's figures, two runs compared, a budget that passes or fails."""
