"""The pipeline stages (DESIGN.md, "One update k"): one module each, `run(ctx)` commits through the store;
what each stage reads and writes, where it runs and when: its entry in the stage table
(`probepo.run.schedule.STAGES`), from which `probepo.stages.runners.STAGES` maps each stage's name to its
`run`.

No stage imports Prefect or submitit: each runs the same inline, in a subprocess or in a SLURM job. This
package imports nothing itself, so the method table (probepo.methods) can use the shared stage modules
that the stages' runs dispatch through it.
"""
