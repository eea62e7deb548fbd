"""Reading runs back: plots, summaries, live tables, spend and cost accounting, statistics."""
