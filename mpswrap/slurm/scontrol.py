"""What Slurm says about a job beyond plain variables: opt-in triggers, launcher steps, and
the job's share of a node (its CPUs, its GPUs' gres/mps shares)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from .. import _proc, trust
from .._struct import Struct
from ..errors import ConfigError, GpuError, MpswrapError
from ..jobenv import JobEnv, parse_int_list, tasks_per_node
from ..values import share_percent
from .gpus import expand_hostlist, in_hostlist

__all__ = [
    "NodeShare",
    "cpus_here",
    "gpu_percentages",
    "holds_part_of_node",
    "is_launcher_daemon_step",
    "job_opted_in",
    "job_state",
    "node_share",
    "os_cpus",
    "scontrol",
    "scontrol_job",
    "signal_step",
]

log = logging.getLogger(__name__)

#: Seconds for one scontrol call.
SCONTROL_TIMEOUT = 10.0
#: Bytes of scontrol's answer kept: it holds what the job's user wrote (a comment, a job name,
#: paths); more, and the answer is not read (a warning).
SCONTROL_LIMIT = 1 << 20


def scontrol(env: JobEnv, argv: list[str]) -> _proc.Result:
    """``scontrol ARGV`` (bounded), found on the safe PATH, for the cluster slurmd names
    (``SLURM_CONF``); as root only an scontrol no other user can change (``trust``)."""
    run_env = {"PATH": _proc.SAFE_PATH}
    if env.env.get("SLURM_CONF"):
        run_env["SLURM_CONF"] = env.env["SLURM_CONF"]
    binary = trust.program("scontrol", _proc.SAFE_PATH)
    return _proc.run([binary, *argv], env=run_env, timeout=SCONTROL_TIMEOUT, limit=SCONTROL_LIMIT)


def signal_step(env: JobEnv, sig: int, launchers: Sequence[str]) -> bool:
    """Send ``sig`` to every task of this task's srun step (``scancel --signal``), so that
    each task's own supervisor ends its rank through the ladder; the caller is one of them.
    False, with a warning, when there is no such step, a launcher of ``launchers`` (process
    names: ``job.launchers.daemon_names``) stands between slurmstepd and us (it ends its
    ranks itself), or scancel failed."""
    step = env.srun_step
    if step is None or not _under_srun(launchers):
        return False
    run_env = {"PATH": _proc.SAFE_PATH, **{k: v for k, v in env.env.items() if k == "SLURM_CONF"}}
    try:
        binary = trust.program("scancel", _proc.SAFE_PATH)
        res = _proc.run(
            [binary, f"--signal={sig}", step],
            env=run_env,
            timeout=SCONTROL_TIMEOUT,
            limit=SCONTROL_LIMIT,
        )
    except MpswrapError as exc:
        log.warning("cannot end the other tasks of step %s: %s", step, exc.line())
        return False
    if res.returncode != 0:
        log.warning(
            "cannot end the other tasks of step %s: scancel exited %d", step, res.returncode
        )
        return False
    return True


def _under_srun(launchers: Sequence[str]) -> bool:
    """This process descends from slurmstepd without a launcher of ``launchers`` or its
    daemon between (whose ranks that launcher ends itself when one fails)."""
    for name in _proc.ancestor_names():
        if name.startswith("slurmstepd"):
            return True
        if name in launchers:
            return False
    return False


def _scontrol_text(env: JobEnv, argv: list[str], what: str) -> str | None:
    """``scontrol ARGV``'s output (bounded); None, with a warning, on failure."""
    try:
        res = scontrol(env, argv)
    except MpswrapError as exc:
        log.warning("cannot query the %s: %s", what, exc.line())
        return None
    if res.returncode != 0:
        log.warning("cannot query the %s: scontrol exited %d", what, res.returncode)
        return None
    return str(res.stdout)


def _scontrol(env: JobEnv, what: str, ident: str) -> dict[str, str]:
    """``scontrol -o show <what> <id>`` as a dict (bounded; empty on failure)."""
    text = _scontrol_text(env, ["-o", "show", what, ident], what)
    if text is None:
        return {}
    return show_fields(text)


#: A word that starts a field of scontrol's answer: ``Key=``.
_KEY = re.compile(r"(\w[\w:/]*)=")


def show_fields(text: str) -> dict[str, str]:
    """``Key=value`` fields of one ``scontrol -o show`` line. A value may hold spaces
    (``Comment=a b``): a new field starts only at a word that begins with ``Key=``. Linear in
    the answer's length, which holds what the job's user wrote."""
    fields: dict[str, str] = {}
    key, value = None, ""
    parts = re.split(r"(\s+)", text.strip())  # word, gap, word, gap, ..., word
    for gap, word in zip(["", *parts[1::2]], parts[::2], strict=True):
        start = _KEY.match(word)
        if start:
            if key is not None:
                fields[key] = value
            key, value = start[1], word[start.end() :]
        elif key is not None:
            value += gap + word
    if key is not None:
        fields[key] = value
    return fields


def _job_id(env: JobEnv) -> str | None:
    """Slurm's job id if it passes the hooks' check: nothing else reaches scontrol's argv."""
    try:
        return env.slurm_job()
    except MpswrapError:
        return None


def scontrol_job(env: JobEnv) -> dict[str, str]:
    job = _job_id(env)
    return _scontrol(env, "job", job) if job else {}


#: A job id a farm's journal may name (digits; an array task's ``_N``): nothing else reaches
#: scontrol's argv.
_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")


def job_state(env: JobEnv, job: str) -> str | None:
    """Slurm's state of job ``job`` (``RUNNING``, ``COMPLETED``, ...); None where the id is no
    job id or Slurm does not answer (a job long over is forgotten)."""
    if not _JOB_ID.fullmatch(job):
        return None
    state = _scontrol(env, "job", job).get("JobState")
    return state if state and state.isalpha() and state.isupper() else None


def is_launcher_daemon_step(env: JobEnv, daemons: Sequence[str]) -> bool:
    """True for a step that runs one of ``daemons``, an MPI launcher's per-node daemon (e.g.
    mpirun's orted; ``job.launchers``): its children are the ranks, which must not all
    inherit one GPU.

    Its environment looks like any other step's; only the step's name tells (Slurm names a
    step after its program). One bounded scontrol call, made only for jobs with daemons.
    """
    job = _job_id(env)
    if job is None or not env.is_real_step:
        return False
    step = _scontrol(env, "step", f"{job}.{env.step_id}")
    return step.get("Name", "").rsplit("/", 1)[-1] in daemons


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[\s,&|*\[\]()]+", text) if w}


def job_opted_in(env: JobEnv, triggers: tuple[str, ...]) -> bool:
    """True if any trigger matches: ``gres-mps``, ``spank`` (``--mps`` of mpswrap's SPANK
    plugin), ``feature:<name>``, ``comment:<word>``."""
    if "gres-mps" in triggers and env.mps_job_percentage is not None:
        return True
    if "spank" in triggers and env.mps_request is not None:
        return True
    wanted_features = {t.split(":", 1)[1] for t in triggers if t.startswith("feature:")}
    wanted_comment = {t.split(":", 1)[1] for t in triggers if t.startswith("comment:")}
    if not wanted_features and not wanted_comment:
        return False
    features = env.env.get("SLURM_JOB_CONSTRAINTS")
    comment = env.env.get("SLURM_JOB_COMMENT")
    if features is None or comment is None:
        # slurmd's prolog gets neither variable on 22.05: ask slurmctld (one bounded call).
        job = scontrol_job(env)
        features = features if features is not None else job.get("Features", "")
        comment = comment if comment is not None else job.get("Comment", "")
    if wanted_features & _words(features):
        return True
    return bool(wanted_comment & _words(comment))


# --- the job's share of this node ------------------------------------------------------------
class NodeShare(Struct, frozen=True):
    """A job's allocation on one node, as ``scontrol show job -d`` details it."""

    #: Slurm's abstract CPU ids (``CPU_IDs=``): by socket, core and thread, not the OS's ids.
    cpu_ids: tuple[int, ...]
    #: The job's share of each GPU in percent (gres.conf position → 100 x its count / the
    #: GPU's count), where Slurm details gres/mps per GPU (23.11+); empty where it does not.
    mps_shares: dict[int, float]
    #: The line's ``GRES=`` as Slurm wrote it.
    gres: str = ""

    @property
    def whole_gpus(self) -> bool:
        """The job holds its GPUs here whole: gres/gpu, and no share of one (mps, shard)."""
        shared = re.search(r"(?:^|,)(?:mps|shard)[:(]", self.gres)
        return bool(re.search(r"(?:^|,)gpu[:(]", self.gres)) and not shared


SYSFS_CPU = "/sys/devices/system/cpu"
#: ``Nodes=node[1-2] CPU_IDs=0-3 Mem=1000 GRES=gpu:2(IDX:0-1),mps:150(...)``
_DETAIL = re.compile(r"^\s*Nodes=(\S+)\s+CPU_IDs=(\S+)\s+Mem=\S+(?:\s+GRES=(\S*))?", re.MULTILINE)


def node_share(env: JobEnv) -> NodeShare | None:
    """This node's line of ``scontrol show job -d``; None (with a warning) when Slurm does
    not answer, or the answer is not one line for this node that agrees with what slurmd told
    the prolog. One bounded call, made by the prolog only.

    Job users write text into that answer (``JobName=``, ``Comment=``, paths; newlines too):
    a line they forge is a second line for the node, or disagrees with slurmd's CPU count,
    and is never taken."""
    job = _job_id(env)
    text = _scontrol_text(env, ["show", "job", "-d", job], "job's allocation") if job else None
    if text is None:
        return None
    found = []
    for match in _DETAIL.finditer(text):
        nodes, cpu_text, gres = match.groups()
        try:
            if in_hostlist(env.node, nodes):
                found.append(NodeShare(parse_int_list(cpu_text, "CPU_IDs"), {}, gres or ""))
        except (ConfigError, GpuError) as exc:
            log.warning("scontrol's job details: %s", exc.line())
            return None
    if len(found) != 1 or len(found[0].cpu_ids) != (cpus_here(env) or len(found[0].cpu_ids)):
        log.warning(
            "scontrol's job details: not one line for node %s that matches the job's "
            "%s CPUs here (%d found)",
            env.node,
            cpus_here(env),
            len(found),
        )
        return None
    return NodeShare(found[0].cpu_ids, mps_shares(found[0].gres), found[0].gres)


def cpus_here(env: JobEnv) -> int | None:
    """The job's CPU count on this node, as slurmd tells the prolog: ``SLURM_JOB_CPUS_PER_NODE``
    (``8(x2),4``) at this node's place in ``SLURM_JOB_NODELIST``."""
    spec = env.env.get("SLURM_JOB_CPUS_PER_NODE")
    nodes = env.env.get("SLURM_JOB_NODELIST") or env.env.get("SLURM_NODELIST")
    try:
        names = expand_hostlist(nodes) if nodes else []
    except GpuError:
        return None
    if not spec or env.node not in names:
        return None
    return tasks_per_node(spec, names.index(env.node))


def mps_shares(gres: str) -> dict[int, float]:
    """The per-GPU shares in a detail line's ``GRES=``: ``mps:150(100/100,50/100)`` (23.11+:
    count/GPU's count for every GPU of the node, by position) gives {0: 100.0, 1: 50.0};
    a total alone (22.05: ``mps:50(IDX:1)``) gives nothing."""
    match = re.search(r"(?:^|,)mps(?::[^:(,]+)?:\d+\(([^)]*)\)", gres)
    if not match:
        return {}
    shares: dict[int, float] = {}
    for position, item in enumerate(match.group(1).split(",")):
        used, sep, count = item.partition("/")
        if not sep or not used.isdigit() or not count.isdigit() or int(count) == 0:
            return {}
        if int(used):
            shares[position] = 100.0 * int(used) / int(count)
    return shares


def holds_part_of_node(env: JobEnv, sysfs: str = SYSFS_CPU) -> bool:
    """True where the job holds fewer than this node's CPUs, as slurmd says: only then is
    slurmctld asked which CPUs it holds."""
    count = cpus_here(env)
    return count is not None and count < len(_online(sysfs))


def os_cpus(abstract: tuple[int, ...], sysfs: str = SYSFS_CPU) -> frozenset[int]:
    """Slurm's abstract CPU ids as the OS's: Slurm numbers a node's CPUs by socket, core and
    thread (hwloc's order), the OS often thread-first. Ids this machine has not are dropped."""
    order = sorted(_online(sysfs), key=lambda cpu: (*_topology(sysfs, cpu), cpu))
    return frozenset(order[i] for i in abstract if i < len(order))


def _online(sysfs: str) -> tuple[int, ...]:
    try:
        return parse_int_list(Path(sysfs, "online").read_text().strip(), "online CPUs")
    except (OSError, ConfigError):
        return tuple(sorted(os.sched_getaffinity(0)))


def _topology(sysfs: str, cpu: int) -> tuple[int, int, int]:
    """(package, die, core) of a CPU; zeros where sysfs does not say."""
    values = []
    for name in ("physical_package_id", "die_id", "core_id"):
        try:
            values.append(int(Path(sysfs, f"cpu{cpu}", "topology", name).read_text()))
        except (OSError, ValueError):
            values.append(0)
    return values[0], values[1], values[2]


def gpu_percentages(
    env: JobEnv, share: NodeShare | None, positions: Sequence[int]
) -> list[float | None]:
    """Each GPU's active thread percentage for a gres/mps job, in ``positions``' order.

    Slurm sets one ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for all of a job's GPUs; with shares
    of several GPUs (23.11+, ``MULTIPLE_SHARING_GRES_PJ``) it is their sum, above 100 where
    they add up to more than one GPU. Each GPU gets its own share from the job's details
    instead, between 1 and 100. Without them the one value must be a percentage in (0, 100].
    """
    total = env.mps_job_percentage
    if total is None:
        return [None] * len(positions)
    shares = share.mps_shares if share else {}
    # Taken only where they are the job's GPUs and add up to Slurm's own value.
    agree = set(shares) == set(positions) and abs(sum(shares.values()) - total) <= len(shares)
    if len(positions) > 1 and agree:
        return [share_percent(shares[p]) for p in positions]
    return [env.mps_percentage] * len(positions)
