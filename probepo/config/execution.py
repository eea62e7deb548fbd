"""The execution profile: where and with what resources each stage runs (SLURM partition, GPUs, memory,
time, signal grace, setup lines), the job folder and the environment jobs may see.

It is not part of a run's recipe: the recipe says what is computed, the profile where. A run may resume
on another partition or executor and gives the same bits.
"""

from __future__ import annotations

import fnmatch
import itertools
import re

from pydantic import Field, field_validator, model_validator

from probepo.config.base import Strict
from probepo.config.retention import Retention
from probepo.run.schedule import EVERY_RANK, Stage

DEFAULT_ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_CA_BUNDLE",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_REQUEST_CHECKSUM_CALCULATION",
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TORCH_EXTENSIONS_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "PROBEPO_*",
)
"""What a job sees of the submitting environment by default: paths, locale, thread counts (bitwise
equality depends on them), where the AWS settings and credential files are, the proxies a site reaches its
store through, and probepo's own settings.
Never credentials themselves: a job reaches S3 through a shared credentials file or an instance role."""

SBATCH_EXTRA = frozenset(
    {
        "exclusive",
        "gres",
        "reservation",
        "exclude",
        "nodelist",
        "gpu_bind",
        "gpu_freq",
        "mem_per_gpu",
        "mem_per_cpu",
        "hint",
        "licenses",
        "comment",
        "mail_type",
        "mail_user",
        "wckey",
        "switches",
        "network",
        "core_spec",
        "threads_per_core",
        "ntasks_per_socket",
        "distribution",
    }
)
"""The sbatch options `sbatch_extra` may set (long names, `_` for `-`): those the named fields do not cover
and that change where or how a job runs, not what probepo relies on (--signal, --requeue, --export,
--output and the job's name are probepo's own)."""

GPU_BIND_KEEPING_EVERY_GPU = frozenset({"none", "verbose,none"})
"""The --gpu-bind values a profile may give: those that leave every GPU of the job's node visible to each of
its ranks, which take GPU LOCAL_RANK (probepo/run/devices.py). The others show a rank only the GPUs it is
bound
to (`closest`: those of its NUMA node, 4 of an 8-GPU two-socket node; `map_gpu`, `mask_gpu`, `per_task`,
`single`: a list of the site's choosing), so index LOCAL_RANK is past them or another rank's GPU, and
DeepSpeed and NCCL's NVLink paths want every GPU visible. One GPU per rank is gpus_per_task: 1, which
SLURM binds itself and devices.py reads as the rank's one GPU."""

MULTI_NODE_STAGES = (Stage.DRIVER, *EVERY_RANK)
"""The stages whose jobs may span several nodes: the resident driver and the stages that run on every rank
of their job (generation split over the ranks, DeepSpeed over them)."""


def _gpu_bind_refusal(where: str, value: object) -> str | None:
    """Why a --gpu-bind value breaks the rule that rank r of a node takes its visible GPU r; None if not."""
    if str(value).replace(" ", "").lower() in GPU_BIND_KEEPING_EVERY_GPU:
        return None
    return (
        f"{where} = {value} would show each rank only the GPUs SLURM binds it to, while every rank must see"
        " all of its node's GPUs and take GPU LOCAL_RANK (probepo/run/devices.py; DeepSpeed and NCCL want"
        " them all): leave gpu_bind out (or give `none`); for one GPU per rank in a generation-only stage"
        " ask gpus_per_task: 1 instead"
    )


_SECRET = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL(?!S_FILE)|^AWS_ACCESS_KEY_ID$", re.IGNORECASE)


class StageResources(Strict):
    """What one stage's job asks SLURM for (sbatch options). The local executor uses only the time limit,
    the signal grace and tasks_per_node (that many rank processes on this machine); inline execution
    none at all."""

    partition: str | None = None
    """SLURM partition (sbatch --partition); None: the cluster's default."""

    account: str | None = None
    """Account charged (sbatch --account); None: the user's default."""

    qos: str | None = None
    """Quality of service (sbatch --qos); None: the account's default QOS. On a site that preempts by QOS
    (PreemptType=preempt/qos) it decides whether the job is preemptable and its GraceTime."""

    nodes: int = Field(1, ge=1)
    """Nodes per job (sbatch --nodes), each running tasks_per_node ranks: nodes x tasks_per_node ranks in
    all, meeting at the job's first node. More than 1 only for the stages that run on every rank (the
    driver, sample, probe, evaluate, score, optimize); the SLURM executors refuse before submitting a
    request the partition's node count cannot meet, the local executor any nodes > 1."""

    tasks_per_node: int = Field(1, ge=1)
    """Ranks per node; each gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as
    torch.distributed and DeepSpeed expect."""

    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node (sbatch --gpus-per-node), every one visible to every rank of the node, rank r using
    GPU r (LOCAL_RANK): what the trainer's stages and the resident job need (DeepSpeed and NCCL's NVLink
    paths want every GPU visible); 0: none. Give tasks_per_node the same number: one rank per GPU."""

    gpus_per_task: int = Field(0, ge=0)
    """GPUs per rank (sbatch --gpus-per-task), each rank seeing only its own: a generation-only stage job
    (sample, probe, evaluate) may ask for 1 instead of gpus_per_node; 0: none. Not with gpus_per_node."""

    @model_validator(mode="after")
    def _one_way_to_ask_for_gpus(self) -> StageResources:
        if self.gpus_per_node and self.gpus_per_task:
            raise ValueError(
                f"gpus_per_node = {self.gpus_per_node} and gpus_per_task = {self.gpus_per_task}: ask for GPUs"
                " one way (gpus_per_node for stages that train, gpus_per_task: 1 for generation alone)"
            )
        if self.gpus_per_node and self.tasks_per_node > self.gpus_per_node:
            raise ValueError(
                f"tasks_per_node = {self.tasks_per_node} ranks share gpus_per_node = {self.gpus_per_node}"
                " GPUs: each rank needs a GPU of its own (tasks_per_node at most gpus_per_node)"
            )
        return self

    cpus_per_task: int = Field(1, ge=1)
    """CPUs per rank (sbatch --cpus-per-task)."""

    gpu_memory_gb: float | None = Field(None, gt=0)
    """Memory of each of the job's GPUs in GB (141 for an H200), asked nothing of SLURM: `probepo check`
    compares the trainer's estimated memory per GPU with it. None: the estimate is shown alone."""

    mem_gb: float | None = Field(None, gt=0)
    """Memory per node in GB (sbatch --mem); None: the partition's default."""

    time_min: int = Field(60, ge=1)
    """Wall-clock limit in minutes (sbatch --time); a job past it is sent the signal, then killed."""

    signal_grace_s: int = Field(60, ge=1)
    """Seconds of warning (sbatch --signal=USR2@<s>): SLURM sends USR2 this long before the time limit,
    and at preemption. The stage commits at its next safe point, then the job requeues itself. At
    preemption the job is killed GraceTime after the signal, the partition's (preempt/partition_prio) or
    the job's QOS's (preempt/qos): `probepo check` refuses a value longer than the one that applies."""

    constraint: str | None = None
    """Node features required (sbatch --constraint), e.g. `h200`."""

    setup: tuple[str, ...] = ()
    """Shell lines the job's batch script runs before it starts the ranks, e.g. `module load cuda/12.4`,
    `source /shared/conda/bin/activate probepo` or `export NCCL_IB_HCA=mlx5`: what they export reaches
    the stage (the ranks' srun passes the job's own environment on). A stage's own lines run after the
    defaults' (they add to them; every other field a stage gives replaces the default's)."""

    srun_args: tuple[str, ...] = ()
    """Extra arguments of the srun that starts the job's ranks, e.g. pyxis's
    `--container-image=/shared/probepo.sqsh` and `--container-mounts=/shared:/shared`. A --gpu-bind that
    hides GPUs from a rank is refused (GPU_BIND_KEEPING_EVERY_GPU)."""

    @field_validator("srun_args")
    @classmethod
    def _srun_keeps_every_gpu(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for arg, following in itertools.pairwise((*args, "")):
            bound = arg == "--gpu-bind" or arg.startswith("--gpu-bind=")
            value = arg.partition("=")[2] or following
            if bound and (refusal := _gpu_bind_refusal("srun_args --gpu-bind", value)):
                raise ValueError(refusal)
        return args

    sbatch_extra: dict[str, str | int | bool] = Field(default_factory=dict)
    """sbatch options the fields above do not name, by long name (`_` or `-`): e.g. `exclusive: true`,
    `gres: gpu:h200:8`, `reservation: my-res`, `exclude: gpu[07-08]`, `wckey: my-project` where the site
    asks for one (probepo sends none otherwise); `true` gives a flag without a value. Only the options of
    probepo.config.execution.SBATCH_EXTRA; others are refused, and so is a `gpu_bind` other than `none`
    (GPU_BIND_KEEPING_EVERY_GPU)."""

    @field_validator("sbatch_extra")
    @classmethod
    def _known_sbatch_options(cls, options: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        named = {key.replace("-", "_"): value for key, value in options.items()}
        unknown = sorted(set(named) - SBATCH_EXTRA)
        if unknown:
            raise ValueError(
                f"sbatch_extra names {', '.join(unknown)}, which it may not set: use the named fields for"
                f" partition, account, qos, nodes, tasks, GPUs, CPUs, memory and time; allowed here:"
                f" {', '.join(sorted(SBATCH_EXTRA))}"
            )
        if "gpu_bind" in named and (refusal := _gpu_bind_refusal("sbatch_extra gpu_bind", named["gpu_bind"])):
            raise ValueError(refusal)
        return named


class ExecutionProfile(Strict):
    """Resources per stage for the local and SLURM executors, and what every job shares. A stage's
    resources are its entry in `stages` over `defaults`, built afresh for every submission."""

    job_folder: str = "out/jobs"
    """submitit's folder (job scripts, pickled submissions, logs, TensorBoard events), one subfolder per
    run; relative: to the profile file's folder (without a profile, to the current one). On a cluster it
    must be shared by the submitting node and the compute nodes (not /tmp)."""

    python: str | None = None
    """The command that starts the job's Python, e.g. `apptainer exec --nv /shared/probepo.sif python`,
    `podman run … python` or `/shared/conda/envs/probepo/bin/python`; None: this interpreter
    (sys.executable), which must then be on a file system the compute nodes share."""

    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    """Names of the environment variables a job receives of the submitting environment (sbatch --export),
    `PREFIX_*` patterns allowed: setting it replaces the default list (env_allow_extra adds to it). Names
    of credentials (…SECRET…, …TOKEN…, AWS_ACCESS_KEY_ID, …) are refused."""

    env_allow_extra: tuple[str, ...] = ()
    """Names (or `PREFIX_*` patterns) added to env_allow, e.g. `NCCL_*` or `CUDA_HOME`; credentials
    refused as there."""

    defaults: StageResources = Field(default_factory=StageResources)
    """Resources of every stage not listed in `stages`, and of the fields a listed stage leaves out."""

    stages: dict[Stage, StageResources] = Field(default_factory=dict)
    """Per-stage resources over `defaults`: only the fields given here override, e.g. `optimize:
    {gpus_per_node: 8, partition: h200}`; a stage's `setup` lines run after the defaults' instead. `driver`
    is the resident executor's one job, which runs every stage: give it what the most demanding stage needs;
    `eval_task` each task of an evaluation job array (one checkpoint on one suite; by default the evaluate
    stage's resources with one GPU)."""

    retention: Retention = Field(default_factory=Retention)
    """Which full checkpoints keep their optimizer state and weights (applied after each full checkpoint,
    and by `probepo store gc --checkpoints`); by default all of them keep everything."""

    max_resubmits: int = Field(2, ge=0)
    """A job that died without committing (node failure, out of memory, SIGKILL, time limit) is submitted
    again at most this many times in a row: a job that committed any of its work (a shard, a part; for the
    resident job any stage) before it died starts the count over, so deaths days apart never end a run.
    A stage's own error is never resubmitted."""

    poll_s: float = Field(1.0, gt=0)
    """Seconds between the driver's polls of a job's state (one sacct call each) after a change: a job
    submitted, a new state, a commit seen. While nothing changes the wait grows by a quarter each poll,
    up to poll_max_s."""

    poll_max_s: float = Field(60.0, gt=0)
    """The longest wait between two polls of a job whose state has not changed for a while (a day-long job
    is polled about once a minute); at least poll_s (equal to it: a fixed interval)."""

    submit_retry_s: float = Field(2.0, ge=0)
    """A submission the scheduler refused for a passing reason (controller busy or unreachable) is tried
    again after this many seconds times the number of tries so far, 4 tries in all."""

    store_outage_s: float = Field(600.0, ge=0)
    """Seconds an unreachable store (connection refused or reset, timeouts, 5xx after botocore's own
    retries) is waited for before a job's stage fails as it would at once: each store operation is tried
    again with capped exponential backoff (probepo/store/outage.py), never past the job's time limit less
    its signal_grace_s. A job that still failed is submitted again like any death (max_resubmits), and
    the processes that wait for jobs never fail of it; 0: fail at the first unanswered request."""

    @field_validator("env_allow", "env_allow_extra")
    @classmethod
    def _no_secrets(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        secrets = [name for name in names if _SECRET.search(name)]
        if secrets:
            raise ValueError(
                f"{', '.join(secrets)} would hand credentials to every job: drop them; jobs reach S3 through"
                " a shared credentials file (AWS_SHARED_CREDENTIALS_FILE) or an instance role"
            )
        return names

    @model_validator(mode="after")
    def _poll_bounds(self) -> ExecutionProfile:
        if self.poll_max_s < self.poll_s:
            raise ValueError(
                f"poll_max_s = {self.poll_max_s} is below poll_s = {self.poll_s}: the wait between polls"
                " starts at poll_s and grows up to poll_max_s; give poll_max_s >= poll_s"
            )
        return self

    @model_validator(mode="after")
    def _every_stage_resolves(self) -> ExecutionProfile:
        for stage in self.stages:
            self.resources(stage)
        one_rank = [s for s in Stage if s not in MULTI_NODE_STAGES and self.resources(s).nodes > 1]
        if one_rank:
            where = "defaults" if any(s not in self.stages for s in one_rank) else "stages"
            raise ValueError(
                f"nodes > 1 for {', '.join(one_rank)} (from {where}): these stages run on one rank, so every"
                f" other node would idle; give nodes > 1 only under stages: {', '.join(MULTI_NODE_STAGES)}"
            )
        return self

    def resources(self, stage: str) -> StageResources:
        """The stage's resources: a fresh object, so nothing set for one submission leaks into another.
        An evaluation array task (`eval_task`) not listed takes the evaluate stage's, on one node with one
        rank and at most one GPU: it evaluates one checkpoint in one process, and eight GPUs held for it
        would idle seven."""
        if stage == Stage.EVAL_TASK and stage not in self.stages:
            evaluate = self.resources(Stage.EVALUATE)
            gpus = 1 if evaluate.gpus_per_node or evaluate.gpus_per_task else 0
            return evaluate.model_copy(
                update={"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "gpus_per_task": gpus}
            )
        override = self.stages.get(stage)  # type: ignore[call-overload]
        given = (
            {} if override is None else {name: getattr(override, name) for name in override.model_fields_set}
        )
        # a stage's setup adds to the defaults' (the site's `module load` and venv stay under a stage's own)
        setup = (*self.defaults.setup, *given.get("setup", ()))
        return StageResources.model_validate({**self.defaults.model_dump(), **given, "setup": setup})

    def entry(self, stage: str) -> str:
        """The entry of the profile `resources(stage)` comes from, as a message names it: `stages.<stage>`,
        `stages.evaluate` for an evaluation task not listed, else `defaults`."""
        if stage in self.stages:
            return f"stages.{stage}"
        if stage == Stage.EVAL_TASK and Stage.EVALUATE in self.stages:
            return f"stages.{Stage.EVALUATE}"
        return "defaults"

    def exported(self, environ: dict[str, str]) -> dict[str, str]:
        """The variables of `environ` a job receives: the allowed names and patterns, credentials never."""
        return {
            name: value
            for name, value in environ.items()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in (*self.env_allow, *self.env_allow_extra))
            and not _SECRET.search(name)
        }
