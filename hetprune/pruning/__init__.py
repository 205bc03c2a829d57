"""The pruning layer: budgets, the job and the steps every depth strategy shares, its report, the plan,
the stored accuracy points, and the one start of a run."""
