"""What mpswrap accepts from Slurm, the environment and the admin file, checked where it is read
(slurm/README.md, "What the hooks accept"): each form Slurm writes passes, everything else is
refused with one line naming the variable and the value, and a GPU named twice costs nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.config import load_settings
from mpswrap.errors import (
    ConfigError,
    GpuError,
    LayoutError,
    MpswrapError,
    UsageError,
    internal_error,
    one_line,
)
from mpswrap.jobenv import JobEnv, parse_gpu_list
from mpswrap.mps.gpu import GpuInfo, Inventory
from mpswrap.slurm.gpus import resolve_slurm_gpus

UUID = "GPU-5a1d0000-0000-4000-8000-000000000000"
MIG = "MIG-5a1d0000-0000-4000-8000-00000000aaaa"
OLD_MIG = f"MIG-{UUID}/1/0"


# --- GPU lists -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "refs"),
    [
        ("0", (0,)),
        ("0,2", (0, 2)),  # what slurmd writes: positions joined by ","
        ("0-3", (0, 1, 2, 3)),
        ("1,0", (1, 0)),
        ("0,0,1,1", (0, 1)),  # a GPU named twice is kept once, in its first place
        ("1,0-1,0", (1, 0)),
        (f"{UUID},0", (UUID, 0)),
        (f"{UUID},{UUID}", (UUID,)),
        (MIG, (MIG,)),
        (OLD_MIG, (OLD_MIG,)),
        (" 0 , 1 ", (0, 1)),
        ("999", (999,)),
    ],
)
def test_gpu_lists_slurm_writes_are_read(text: str, refs: tuple[object, ...]) -> None:
    assert parse_gpu_list(text, "SLURM_JOB_GPUS") == refs


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0,",
        ",0",
        "0,,1",
        "x",
        "0-",
        "-1",
        "3-1",
        "1000",
        "0-1000",
        "0 1",
        "0;1",
        "٣",
        "GPU-zzz",
        "gpu-5a1d0000-0000-4000-8000-000000000000",
        f"{UUID}x",
        "MIG-GPU-x/1/0",
    ],
)
def test_anything_else_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_gpu_list(text, "SLURM_STEP_GPUS")
    assert caught.value.line().startswith(f"malformed SLURM_STEP_GPUS ({text!r}): ")


def test_job_gpus_come_from_cuda_visible_devices_only_in_a_prolog_without_slurm_job_gpus() -> None:
    assert JobEnv({"CUDA_VISIBLE_DEVICES": "0"}).job_gpus is None
    prolog = {"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    assert JobEnv({**prolog, "CUDA_VISIBLE_DEVICES": UUID}).job_gpus == (UUID,)
    assert JobEnv({**prolog, "CUDA_VISIBLE_DEVICES": "NoDevFiles"}).job_gpus is None
    env = {**prolog, "CUDA_VISIBLE_DEVICES": UUID, "SLURM_JOB_GPUS": "1,1"}
    assert JobEnv(env).job_gpus == (1,)


INVENTORY = Inventory(
    [
        GpuInfo(i, f"GPU-5a1d000{i}-0000-4000-8000-00000000000{i}", m, "H100", (9, 0), frozenset())
        for i, m in enumerate((7, 3))
    ],
    source="test",
)


def test_positions_and_uuids_of_one_gpu_resolve_to_it_once() -> None:
    # Without gres.conf, positions follow minor numbers: position 0 is minor 3 (index 1).
    found = resolve_slurm_gpus([0, INVENTORY.gpus[1].uuid, 1, 0], INVENTORY, None, "n1")
    assert [(pos, gpu.index) for pos, gpu in found] == [(0, 1), (1, 0)]


def test_mig_devices_are_refused_by_name() -> None:
    for mig in (MIG, OLD_MIG):
        with pytest.raises(GpuError, match="MIG devices are not supported"):
            resolve_slurm_gpus([mig], INVENTORY, None, "n1")


# --- job ids, users --------------------------------------------------------------------------
@pytest.mark.parametrize("job", ["101", "4294967294", "123_4", "run-7"])
def test_a_job_id_that_is_one_safe_name_is_the_hooks_key(job: str) -> None:
    assert JobEnv({"SLURM_JOB_ID": job, "SLURMD_NODENAME": "n1"}).slurm_job() == job


@pytest.mark.parametrize("job", ["a/b", "..", "x" * 65, "1\n2", "123+0", "-1", " 1"])
def test_any_other_job_id_is_refused(job: str) -> None:
    with pytest.raises(LayoutError, match="invalid job id"):
        JobEnv({"SLURM_JOB_ID": job, "SLURMD_NODENAME": "n1"}).slurm_job()


def test_a_missing_job_id_or_a_bad_node_name_is_refused() -> None:
    with pytest.raises(MpswrapError, match="SLURM_JOB_ID is not set"):
        JobEnv({"SLURM_JOB_ID": "", "SLURMD_NODENAME": "n1"}).slurm_job()
    with pytest.raises(LayoutError, match="invalid node name"):
        JobEnv({"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "a/b"}).slurm_job()


@pytest.mark.parametrize("given", ["123_4", "123+0"])
def test_slurms_display_forms_are_refused_with_the_way_to_the_number(given: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobEnv({}).job_key(given=given)
    assert caught.value.hint == f"the number is JobId= in: scontrol show job {given}"
    assert JobEnv({}).job_key(given="run-123_4") == "run-123_4"


@pytest.mark.parametrize("name", ["SLURM_JOB_UID", "SLURM_JOB_GID"])
def test_ids_are_decimal_numbers_below_the_invalid_id(name: str) -> None:
    attribute = name.lower().removeprefix("slurm_")
    assert getattr(JobEnv({name: "0"}), attribute) == 0
    assert getattr(JobEnv({name: "4294967294"}), attribute) == 4294967294
    assert getattr(JobEnv({}), attribute) is None
    for bad in ("abc", "-1", "+1", "1e3", "٣", "4294967295", "99999999999"):
        with pytest.raises(ConfigError, match=f"malformed {name}"):
            getattr(JobEnv({name: bad}), attribute)


def test_numbers_from_the_environment_are_ascii_decimals() -> None:
    assert JobEnv({"SLURM_LOCALID": "-3"}).local_rank == -3
    for bad in ("٣", "1_0", "+1", " 1", "x"):
        with pytest.raises(ConfigError, match="malformed SLURM_LOCALID"):
            _ = JobEnv({"SLURM_LOCALID": bad}).local_rank
    assert not JobEnv({"SLURM_STEP_ID": "٣"}).is_real_step
    assert JobEnv({"SLURM_TASKS_PER_NODE": "٣"}).local_size is None
    assert JobEnv({"SLURM_TASKS_PER_NODE": "2,3", "SLURM_NODEID": "٣"}).local_size == 2


@pytest.mark.parametrize("text", ["0", "625", "abc", "nan", "1e2", "-5", "100.5"])
def test_a_percentage_outside_0_to_100_is_refused_not_applied(text: str) -> None:
    with pytest.raises(ConfigError, match="malformed CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        _ = JobEnv({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": text}).mps_percentage
    assert JobEnv({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}).mps_percentage == 25.0


# --- settings --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("var", "text"),
    [
        ("MPSWRAP_START_TIMEOUT", "1e3"),
        ("MPSWRAP_START_TIMEOUT", "\u0661\u0660"),  # float() reads any script's digits
        ("MPSWRAP_QUIT_TIMEOUT", "1_0"),
        ("MPSWRAP_ACTIVE_THREAD_PERCENTAGE", "5e1"),
        ("MPSWRAP_CLIENT_LIMIT", "1_0"),
        ("MPSWRAP_CLIENT_LIMIT", "٣"),
        ("MPSWRAP_PINNED_MEM_LIMIT", "٣G"),
        ("MPSWRAP_CONTROL_BINARY", "bin/nvidia-cuda-mps-control"),
        ("MPSWRAP_CONTROL_BINARY", ""),
        ("MPSWRAP_RUN_DIR", "/run/mpswrap\nrun_dir = /tmp"),
        ("MPSWRAP_LOG_ARCHIVE", "/var/log/\x1b[2Jmps"),
    ],
)
def test_bad_setting_values_are_refused(var: str, text: str) -> None:
    with pytest.raises(ConfigError, match="bad value for"):
        load_settings(env={var: text})


def test_control_binary_is_a_name_or_an_absolute_path() -> None:
    assert load_settings(env={}).control_binary == "nvidia-cuda-mps-control"
    env = {"MPSWRAP_CONTROL_BINARY": "/usr/bin//nvidia-cuda-mps-control"}
    assert load_settings(env=env).control_binary == "/usr/bin/nvidia-cuda-mps-control"


def test_collected_problems_keep_their_defaults_and_the_rest_applies(tmp_path: Path) -> None:
    conf = tmp_path / "mpswrap.conf"
    conf.write_text("quit_timeout = 7\nno equals sign\ngpu_policy = random\ncolour = red\n")
    problems: list[ConfigError] = []
    settings = load_settings(env={}, config_file=str(conf), problems=problems)
    assert (settings.quit_timeout, settings.gpu_policy) == (7.0, "block")
    assert [p.what for p in problems] == [
        "expected key = value",
        "bad value for gpu_policy",
        "unknown setting",
    ]
    with pytest.raises(ConfigError, match="expected key = value"):
        load_settings(env={}, config_file=str(conf))


def test_an_unreadable_file_is_one_collected_problem(tmp_path: Path) -> None:
    problems: list[ConfigError] = []
    settings = load_settings(env={}, config_file=str(tmp_path / "absent"), problems=problems)
    assert settings.run_dir == "/run/mpswrap"
    assert [p.line() for p in problems] == [
        f"cannot read config file ({tmp_path / 'absent'}): No such file or directory"
    ]


# --- one line --------------------------------------------------------------------------------
def test_every_message_is_one_line() -> None:
    error = MpswrapError("failed", thing="x", cause="first\nsecond\r\n  third\n")
    assert error.line() == "failed (x): first | second | third"
    assert one_line("a\n\nb") == "a | b"
    assert internal_error(KeyError("k\ney"), "with --debug") == (
        "internal error: KeyError: 'k\\ney' (traceback with --debug)"
    )
    bare = internal_error(RuntimeError(), "x")
    assert bare == "internal error: RuntimeError: (no message) (traceback x)"


# --- empty values and paths the command line refuses before acting --------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["install-hooks", "--modulefile", ""],
        ["install-hooks", "--dest", ""],
        ["uninstall-hooks", "--modulefile", ""],
    ],
)
def test_an_empty_path_of_the_hook_installer_is_refused_before_it_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from mpswrap.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mpswrap: argument {argv[1]}: invalid value '': expected a path\n")


def test_the_simulators_own_command_line_says_what_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mpswrap.sim.__main__ import main

    assert main(["inventory", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m mpswrap.sim: cannot write the GPU inventory ({tmp_path}): ")


_NOT_AN_INVENTORY = (
    'not an inventory: expected an object whose "gpus" is a list of GPUs (as mpswrap sim '
    "inventory writes)"
)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("not json", "not JSON (line 1 column 1)"),
        ('{"driver_version": "580"}', _NOT_AN_INVENTORY),
        ("[]", _NOT_AN_INVENTORY),
        ('{"gpus": [1]}', _NOT_AN_INVENTORY),
        ('{"gpus": [{"index": 0}]}', "not an inventory: a GPU has no field 'uuid'"),
        (
            '{"gpus": [{"index": "x", "uuid": "u", "minor": 0, "compute_capability": [9, 0]}]}',
            "not an inventory: a field has a value of the wrong type or out of range",
        ),
    ],
)
def test_a_bad_inventory_file_is_a_bad_setting(tmp_path: Path, text: str, cause: str) -> None:
    from mpswrap.mps.gpu import load_inventory

    path = tmp_path / "gpus.json"
    path.write_text(text)
    with pytest.raises(GpuError) as caught:
        load_inventory(str(path))
    assert caught.value.exit_code == 2
    assert caught.value.line() == f"cannot read GPU inventory file ({path}): {cause}"


def test_a_relative_run_dir_is_made_absolute_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemons' variables and every later command name it from anywhere."""
    from mpswrap.cli.options import run_dir

    monkeypatch.chdir(tmp_path)
    assert run_dir("rel/dir") == str(tmp_path / "rel" / "dir")
    assert run_dir("/abs/./dir") == "/abs/dir"
