"""Running a recipe: the pipeline's driver, its schedule, stage execution, preemption and leases."""
