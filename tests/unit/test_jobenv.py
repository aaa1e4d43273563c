from __future__ import annotations

import pytest

from mpswrap.errors import ConfigError
from mpswrap.jobenv import LOCAL_RANK_VARS, JobEnv, parse_int_list


def test_innermost_launcher_wins_over_slurm() -> None:
    # mpirun inside a batch job: every rank inherits SLURM_LOCALID=0.
    env = JobEnv(
        {
            "SLURM_LOCALID": "0",
            "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "SLURM_TASKS_PER_NODE": "1",
        }
    )
    assert env.local_rank == 3
    # the rank came from Open MPI's variable, which is read before Slurm's
    assert LOCAL_RANK_VARS.index("OMPI_COMM_WORLD_LOCAL_RANK") < LOCAL_RANK_VARS.index(
        "SLURM_LOCALID"
    )
    assert env.local_size == 4


@pytest.mark.parametrize(
    "var",
    [
        "MPI_LOCALRANKID",
        "PMI_LOCAL_RANK",
        "PALS_LOCAL_RANKID",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "FLUX_TASK_LOCAL_ID",
    ],
)
def test_each_launcher_variable_beats_slurm(var: str) -> None:
    assert JobEnv({"SLURM_LOCALID": "0", var: "2"}).local_rank == 2


def test_slurm_then_local_rank() -> None:
    assert JobEnv({"SLURM_LOCALID": "1", "LOCAL_RANK": "5"}).local_rank == 1
    assert JobEnv({"LOCAL_RANK": "5"}).local_rank == 5
    assert JobEnv({}).local_rank is None


def test_malformed_local_rank() -> None:
    with pytest.raises(ConfigError, match="malformed SLURM_LOCALID"):
        _ = JobEnv({"SLURM_LOCALID": "x"}).local_rank


def test_tasks_per_node_forms() -> None:
    assert JobEnv({"SLURM_TASKS_PER_NODE": "4(x2)"}).local_size == 4


def test_job_fields_and_steps() -> None:
    env = JobEnv(
        {
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_GPUS": "0,2-3",
            "SLURMD_NODENAME": "n1",
            "SLURM_STEP_ID": "0",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        }
    )
    assert (env.job_id, env.job_uid, env.node) == ("42", 1000, "n1")
    assert env.job_gpus == (0, 2, 3)
    assert env.is_real_step
    assert env.mps_percentage == 25.0
    assert not JobEnv({"SLURM_STEP_ID": "batch"}).is_real_step
    assert not JobEnv({}).is_real_step


@pytest.mark.parametrize(
    "text",
    [
        "a",
        "1-",
        "3-1",
        "-1",
        "0,,x",
        "\u0660",
        "1-\u0663",
        "1_0",
        "\u00b2",
        "0x1",
        "+1",
        "12345678",
    ],
)
def test_bad_lists(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_int_list(text)


def test_list_forms() -> None:
    assert parse_int_list("0-2,5") == (0, 1, 2, 5)
    assert parse_int_list("") == ()


def test_uneven_tasks_per_node_use_this_nodes_count() -> None:
    assert JobEnv({"SLURM_TASKS_PER_NODE": "4,3", "SLURM_NODEID": "1"}).local_size == 3
    assert JobEnv({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}).local_size == 1
    assert JobEnv({"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "8"}).local_size == 2
    assert JobEnv({"SLURM_TASKS_PER_NODE": "x"}).local_size is None


@pytest.mark.parametrize(
    ("namespace", "key"),
    [("prterun-vm-24085@1", "prterun-vm-24085-1"), ("ns/1", "ns-1"), ("a b:c", "a-b-c")],
)
def test_a_pmix_namespace_is_a_job_key_of_safe_characters(namespace: str, key: str) -> None:
    """Ranks of one mpirun share its PMIx namespace; Open MPI 5 writes '@' into it."""
    assert JobEnv({"PMIX_NAMESPACE": namespace}).job_key() == key


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "2",
                "SLURM_PROCID": "1",
                "SLURM_STEP_NUM_TASKS": "3",
            },
            "7.2",
        ),
        # one task: nobody else to end
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "2",
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "1",
            },
            None,
        ),
        # the batch step, and no step at all
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "batch",
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "3",
            },
            None,
        ),
        ({"SLURM_JOB_ID": "7"}, None),
        # srun's PMIx plugin sets PMIX_RANK too
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "2",
                "SLURM_PROCID": "1",
                "SLURM_STEP_NUM_TASKS": "3",
                "PMIX_RANK": "1",
            },
            "7.2",
        ),
        # ranks of mpirun (its orted is srun's task): mpirun ends its own ranks
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "2",
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "OMPI_COMM_WORLD_RANK": "5",
            },
            None,
        ),
        # only a plain job number goes on scancel's command line
        (
            {
                "SLURM_JOB_ID": "7;x",
                "SLURM_STEP_ID": "2",
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
            },
            None,
        ),
    ],
)
def test_srun_step_names_the_step_only_for_srun_tasks(
    env: dict[str, str], expected: str | None
) -> None:
    assert JobEnv(env).srun_step == expected


def test_the_launcher_mpswrap_prefixed_names_its_ranks_variables_first() -> None:
    """``mpswrap torchrun ...`` in a batch script: every worker inherits ``SLURM_LOCALID=0``
    of the batch step; the launcher's own variables (``MPSWRAP_RANK_VARS``) come first, and
    mpswrap's own (``mpswrap run``) before them."""
    env = {"SLURM_LOCALID": "0", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    assert JobEnv(env).local_rank == 0
    ranked = {**env, "MPSWRAP_RANK_VARS": "LOCAL_RANK,LOCAL_WORLD_SIZE"}
    assert (JobEnv(ranked).local_rank, JobEnv(ranked).local_size) == (3, 4)
    inner = {**ranked, "MPSWRAP_LOCAL_RANK": "1", "MPSWRAP_LOCAL_SIZE": "2"}
    assert (JobEnv(inner).local_rank, JobEnv(inner).local_size) == (1, 2)
    bogus = {**env, "MPSWRAP_RANK_VARS": "PATH,HOME"}  # only rank variables it knows
    assert JobEnv(bogus).local_rank == 0
