"""Multi-host launchers: the per-worker commands they build, and their --dry_run output."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from launch import launchers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--config=configs/tiny_textworld.py", "--workdir=/shared/runs/x", "--config.seed=3"]


def _dry_run(module, *args):
    cmd = [sys.executable, "-m", module, *args]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    return out


def _train_flags(command: str) -> list[str]:
    """The launch.train flags inside a ``cd DIR && [ENV=..] python -m launch.train ...`` line."""
    words = shlex.split(command)
    return words[words.index("launch.train") + 1 :]


def test_tpu_pod_command_runs_the_same_train_command_on_every_worker():
    argv = launchers.tpu_pod_command("pod-a", TRAIN, zone="us-central2-b", project="proj")
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-a"]
    assert "--zone=us-central2-b" in argv and "--project=proj" in argv
    assert "--worker=all" in argv
    assert "--ssh-flag=-tt" in argv  # ending gcloud hangs up the workers' trainers
    command = argv[-1].removeprefix("--command=")
    assert command.startswith("cd ~/agentrl_jax && AGENTRL_DISTRIBUTED=1 python3 -m launch.train")
    assert _train_flags(command) == TRAIN  # jax.distributed detects the slice: no ids


def test_gpu_node_commands_give_each_node_its_process_id():
    cmds = launchers.gpu_node_commands(["n0", "n1", "n2"], TRAIN, port=4321, repo_dir="/r x")
    # -tt: killing the local ssh client hangs up the remote terminal, ending the trainer.
    assert [c[:3] for c in cmds] == [["ssh", "-tt", f"n{i}"] for i in range(3)]
    for i, cmd in enumerate(cmds):
        assert cmd[3].startswith("cd '/r x' && python3 -m launch.train")
        assert _train_flags(cmd[3]) == [
            *TRAIN,
            "--coordinator_address=n0:4321",
            "--num_processes=3",
            f"--process_id={i}",
        ]


def test_slurm_command_runs_one_task_per_node():
    argv = launchers.slurm_command(4, TRAIN, repo_dir="/r", gpus_per_node=8)
    assert argv[:5] == [
        "srun",
        "--nodes=4",
        "--ntasks=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
    ]
    assert argv[5:7] == ["bash", "-c"]
    assert "AGENTRL_DISTRIBUTED=1" in argv[7]
    assert _train_flags(argv[7]) == TRAIN


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: launchers.check_train_args(["--workdir=/w"]), "lack --config="),
        (lambda: launchers.check_train_args(["--config=c.py"]), "lack --workdir="),
        (
            lambda: launchers.check_train_args([*TRAIN, "--process_id=1"]),
            "--process_id is set by the launcher",
        ),
        (lambda: launchers.tpu_pod_command("", TRAIN, zone="z"), "tpu is empty"),
        (lambda: launchers.tpu_pod_command("pod", TRAIN, zone=""), "zone is empty"),
        (lambda: launchers.gpu_node_commands([], TRAIN, repo_dir="/r"), r"hosts=\[\]"),
        (lambda: launchers.gpu_node_commands(["a", "a"], TRAIN, repo_dir="/r"), "twice"),
        (
            lambda: launchers.gpu_node_commands(["a"], TRAIN, port=70000, repo_dir="/r"),
            "port=70000",
        ),
        (lambda: launchers.slurm_command(0, TRAIN, repo_dir="/r"), "num_nodes=0"),
        (lambda: launchers.train_command(TRAIN, repo_dir=""), "repo_dir is empty"),
    ],
)
def test_bad_launch_settings_fail_naming_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tpu_pod_dry_run_prints_the_worker_command_and_runs_nothing():
    out = _dry_run("launch.tpu_pod", "--tpu=pod-a", "--zone=z1", "--dry_run", "--", *TRAIN)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    worker, gcloud = lines
    assert _train_flags(worker) == TRAIN
    argv = shlex.split(gcloud)  # the printed line is a valid shell command
    assert argv == launchers.tpu_pod_command("pod-a", TRAIN, zone="z1")


def test_gpu_dry_run_prints_one_command_per_node():
    out = _dry_run(
        "launch.multinode_gpu", "--hosts=g0,g1", "--port=2222", "--repo_dir=/r", "--dry_run",
        "--", *TRAIN,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [shlex.split(x) for x in out.stdout.splitlines() if not x.startswith("#")]
    assert lines == launchers.gpu_node_commands(["g0", "g1"], TRAIN, port=2222, repo_dir="/r")
    assert "# node 1 (g1), process 1 of 2:" in out.stdout


def test_slurm_dry_run_prints_the_srun_line():
    out = _dry_run(
        "launch.multinode_gpu", "--slurm_nodes=2", "--repo_dir=/r", "--dry_run", "--", *TRAIN
    )
    assert out.returncode == 0, out.stderr
    lines = [shlex.split(x) for x in out.stdout.splitlines() if not x.startswith("#")]
    assert lines == [launchers.slurm_command(2, TRAIN, repo_dir="/r")]


def test_launcher_usage_errors_exit_nonzero_with_the_reason():
    out = _dry_run("launch.multinode_gpu", "--hosts=a", "--dry_run", "--", "--workdir=/w")
    assert out.returncode != 0 and "lack --config=" in out.stdout + out.stderr
    out = _dry_run("launch.multinode_gpu", "--dry_run", "--", *TRAIN)
    assert out.returncode != 0 and "exactly one of --hosts" in out.stdout + out.stderr


def _sleeper(pid_file, seconds=60):
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
    return [sys.executable, "-c", code + f"time.sleep({seconds})"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return int(path.read_text())


def test_run_all_stops_the_others_when_one_fails(tmp_path):
    start = time.monotonic()
    failing = [sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(3)"]
    code = launchers.run_all([_sleeper(tmp_path / "a"), failing], poll_s=0.05, grace_s=5)
    assert code == 3
    assert not _alive(_wait_for(tmp_path / "a"))
    assert time.monotonic() - start < 30  # not the sleeper's 60 s


def test_killing_the_launcher_ends_every_node_command(tmp_path):
    """SIGTERM to the launcher stops its node commands (ssh clients, whose -tt ends the remote
    trainers), instead of leaving them running."""
    nodes = [_sleeper(tmp_path / "n0"), _sleeper(tmp_path / "n1")]
    script = (
        "import sys; from launch import launchers; "
        f"sys.exit(launchers.run_all({nodes!r}, poll_s=0.05, grace_s=5))"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    pids = [_wait_for(tmp_path / "n0"), _wait_for(tmp_path / "n1")]
    assert all(_alive(p) for p in pids)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    assert not any(_alive(p) for p in pids)
