"""Reading a container runtime's command line: does its container see the pipe directory at
the same path, and get the variables? (``job.containers``; the functional tier runs Podman
and bubblewrap for real, tests/functional/test_containers.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpswrap.errors import UsageError
from mpswrap.job.containers import check, flags, runtime_named, runtime_of

JOB = Path("/run/mpswrap/n1/42")
PIPES = [JOB / "g0" / "pipe", JOB / "g1" / "pipe"]
PASS = ["-e", "CUDA_MPS_PIPE_DIRECTORY", "-e", "MPSWRAP_TREE"]

GIVEN = [
    # (command line, environment) that reach the daemons
    (["podman", "run", "-v", f"{JOB}:{JOB}", *PASS, "img", "./app"], {}),
    (["podman", "run", "--volume=/run/mpswrap:/run/mpswrap:ro", "--env-host", "img"], {}),
    (["docker", "run", "--mount", f"type=bind,src={JOB},dst={JOB}", *PASS, "img"], {}),
    (["podman", "--log-level=debug", "run", "--name", "x", "-v", "/:/", *PASS, "img"], {}),
    (["apptainer", "exec", "--bind", "/run/mpswrap", "a.sif", "./app"], {}),
    (["singularity", "exec", "a.sif", "./app"], {"SINGULARITY_BINDPATH": "/x,/run/mpswrap"}),
    (
        [
            "apptainer",
            "exec",
            "-B",
            f"{JOB}",
            "--cleanenv",
            "--env",
            "CUDA_MPS_PIPE_DIRECTORY=/p",
            "a.sif",
        ],
        {},
    ),
    (["podman", "run", "-v", f"{JOB}:{JOB}", "--tmpfs", "/run", *PASS, "img"], {}),  # deeper
    (["enroot", "start", "--mount", f"{JOB}:{JOB}", "img", "./app"], {}),
    (["bwrap", "--ro-bind", "/", "/", "--tmpfs", "/run", "--bind", f"{JOB}", f"{JOB}", "app"], {}),
    (["sh", "-c", f"podman run -v {JOB}:{JOB} {' '.join(PASS)} img ./app"], {}),
    # expanded at run time, or not a runtime: not ours to judge
    (["sh", "-c", "podman run $(mpswrap container-args podman) img ./app"], {}),
    (["./app", "-v", "x"], {}),
    (["podman", "ps"], {}),
]

REFUSED: list[tuple[list[str], dict[str, str], str]] = [
    # (command line, environment, words of the refusal)
    (["podman", "run", *PASS, "img", "-v", f"{JOB}:{JOB}"], {}, "does not bind"),  # the app's -v
    (["podman", "run", "-v", f"/srv:{JOB}", *PASS, "img"], {}, "does not bind"),  # elsewhere
    (["podman", "run", "-v", f"{JOB}:{JOB}", "-e", "MPSWRAP_TREE", "img"], {}, "CUDA_MPS_PIPE"),
    (["podman", "run", "-v", f"{JOB}:{JOB}", "-e", "CUDA_MPS_PIPE_DIRECTORY", "img"], {}, "TREE"),
    (["apptainer", "exec", "a.sif", "./app"], {}, "add --bind /run/mpswrap/n1/42,"),
    (["apptainer", "exec", "-B", str(JOB), "-e", "a.sif"], {}, "CUDA_MPS_PIPE_DIRECTORY"),
    (["bwrap", "--bind", "/", "/", "--tmpfs", "/run/mpswrap", "app"], {}, "does not bind"),
    (["bwrap", "--bind", f"{JOB}", f"{JOB}", "--tmpfs", "/run", "app"], {}, "does not bind"),
    (["bwrap", "--bind", "/", "/", "--clearenv", "app"], {}, "--setenv CUDA_MPS_PIPE_DIRECTORY"),
    (["/bin/sh", "-c", "podman run img ./app"], {}, "add -v /run/mpswrap/n1/42:/run/mpswrap"),
]


@pytest.mark.parametrize(("argv", "env"), GIVEN)
def test_what_reaches_the_daemons_passes(argv: list[str], env: dict[str, str]) -> None:
    check(argv, PIPES, env)


@pytest.mark.parametrize(("argv", "env", "words"), REFUSED)
def test_what_misses_the_daemons_is_refused_naming_the_flag(
    argv: list[str], env: dict[str, str], words: str
) -> None:
    with pytest.raises(UsageError) as caught:
        check(argv, PIPES, env)
    assert words in caught.value.line() and "\n" not in caught.value.line()
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("name", ["podman", "docker", "apptainer", "enroot", "bwrap"])
def test_the_flags_a_runtime_is_given_pass_its_own_check(name: str) -> None:
    runtime = runtime_named(name)
    given = flags(runtime, JOB, 1001)
    argv = [name, *sorted(runtime.verbs)[:1], *given, "image-or-program"]
    found = runtime_of(argv)
    assert found is not None and found[0] is runtime
    check(argv, PIPES, {"HOME": "/home/u"})


def test_podman_and_docker_keep_signals_and_the_uid() -> None:
    assert flags(runtime_named("podman"), JOB, 1001)[-2:] == [
        "--sig-proxy=false",
        "--userns=keep-id",
    ]
    assert "--userns=keep-id" not in flags(runtime_named("podman"), JOB, 0)
    assert flags(runtime_named("docker"), JOB, 1001)[-2] == "--user"
