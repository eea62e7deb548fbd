"""What a launch verifies before it submits anything, on the login node and in seconds, one module per
subject: `probepo check`, the train and resume flows and `probepo launch` all run them
(`launch.check_launch`, in order), and a run that fails one is refused with one line per problem naming the
field or file and what to do, instead of a job failing minutes or hours into an allocation.

findings   what a check found (`Findings`), and the refusal of a run (`Refused`)
launch     what the checks read of a launch (`Launch`) and every subject's check, in order
model      the model's files: folder or hub cache, config, tokenizer, every weight shard's header
data       the benchmark files and the task built as a job builds it, against the model's context
store      the store's listing, a write and a delete, and its conditional requests
jobs       each job's ranks against generation's engine calls, and its GPUs against the engines'
memory     each job's memory, host and GPU, against the profile's (the memory model)
evaluation the evaluation's largest shard against the grace window of the job that evaluates
spend      what an update moves and how long that takes, against the trainer's grace window
recipe     the recipe validated, and its checkpoint_every against the executor
credentials an S3 store's credentials as the executor's jobs receive them
environment the worker's variables, the jobs' interpreter and their setup lines
site       the executor's backend's word on the site (slurm/site.py for SLURM)

A new check is a function in its subject's module, called from that module's `check`; a new subject is a
module with `check(launch) -> Findings`, named in `launch.SUBJECTS`. The checks never import flows/ or
slurm/: what they need of an executor and its backend comes in the `Launch` (slurm/check.py builds it).
This file imports nothing: the credentials check's child interpreter imports `checks.credentials` alone.
"""
