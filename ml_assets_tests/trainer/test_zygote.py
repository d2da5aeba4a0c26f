"""Ranks forked from the trainer zygote (ml_assets.trainer.zygote) under real torchrun: the same bits
as ranks started directly, the same identity and lifetime, and a plain start when there is no zygote."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ml_assets import processes
from ml_assets.trainer import zygote
from ml_assets_tests.trainer import toy

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def socket_path():
    process, path = zygote.start()
    assert path, "the zygote did not start"
    yield path
    zygote.stop(process)
    assert not reachable(path)


def reachable(address: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(zygote.socket_address(address))
        except OSError:
            return False
    return True


def forked(args: list[str]) -> list[str]:
    return [*args[:args.index("ml_assets.trainer")], "ml_assets.trainer.forked", *args[args.index("ml_assets.trainer") + 1:]]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_forked_ranks_train_the_bits_started_ranks_do(tmp_path, socket_path):
    data = toy.toy_data(tmp_path / "data", train_rows=1500)
    reports = {}
    for how in ("exec", "fork"):
        config = tmp_path / f"{how}.json"
        toy.write_config(config, data, output_dir=str(tmp_path / how), epochs=2, seed=5)
        args = toy.torchrun_args(config, nproc=2)
        proc = toy.run(forked(args) if how == "fork" else args, **{zygote.SOCKET_ENV: socket_path})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "starting the rank in this process" not in proc.stderr
        reports[how] = json.loads((tmp_path / how / "report.json").read_text())["metadata"]
    assert sha(tmp_path / "fork" / "model.safetensors") == sha(tmp_path / "exec" / "model.safetensors")
    assert reports["fork"]["world_size"] == 2


def test_a_forked_rank_counts_its_seconds_alive_from_its_clients_start():
    # This test's process stands for the client (alive for a while); the child follows it as a
    # forked rank follows its client, and counts from its start, not from its own.
    code = ("import os; from ml_assets import processes as p; own = p.seconds_alive(); "
            "parent = os.getppid(); p.follow_process(parent, p.start_ticks(parent)); print(own, p.seconds_alive())")
    own, counted = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True, env=toy.cli_env()).stdout.split())
    assert counted >= processes.seconds_alive() - 0.05 > own + 0.2


def test_a_forked_rank_shows_as_a_rank_and_dies_at_once_with_its_client(tmp_path, socket_path):
    data = toy.toy_data(tmp_path / "data", train_rows=100_000)
    config = tmp_path / "config.json"
    toy.write_config(config, data, output_dir=str(tmp_path / "out"), epochs=200, seed=5)
    home = tmp_path / "home"
    agent = toy.start(forked(toy.torchrun_args(config)), tmp_path / "log", ML_ASSETS_HOME=str(home),
                      **{zygote.SOCKET_ENV: socket_path})
    try:
        toy.wait_for(lambda: len(toy.training_ranks(home)) == 1, 60, "the forked rank")
        (rank,) = toy.training_ranks(home)
        (client,) = toy.worker_pids(agent.pid)
        assert rank != client
        stat = Path(f"/proc/{rank}/stat").read_text()
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        assert "ml_assets.trainer.zygote" in Path(f"/proc/{parent}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{rank}/environ").read_bytes().split(b"\0")
        assert f"ML_ASSETS_HOME={home}".encode() in environ and zygote.ROOM_ENV.encode() not in b"".join(environ)
        started = processes.start_ticks(rank)
        os.kill(client, signal.SIGKILL)
        toy.wait_for(lambda: not processes.is_alive(rank, started), 3, "the rank to die with its client")
        assert agent.wait(timeout=60) != 0  # torchrun saw its worker die (no restarts left)
    finally:
        toy.kill_tree(agent)


def test_without_a_zygote_the_worker_starts_the_rank_itself_and_says_why(tmp_path):
    data = toy.toy_data(tmp_path / "data", train_rows=600)
    config = tmp_path / "config.json"
    toy.write_config(config, data, output_dir=str(tmp_path / "out"), epochs=1, seed=5)
    missing = tmp_path / "no-such-zygote"
    proc = toy.run(forked(toy.torchrun_args(config)), **{zygote.SOCKET_ENV: str(missing)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the trainer zygote at {missing} cannot be reached" in proc.stderr
    assert "starting the rank in this process" in proc.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_the_zygote_refuses_a_client_that_runs_another_python(socket_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(zygote.socket_address(socket_path))
        zygote.send_request(sock, {"argv": ["--config", "x"], "env": {}, "cwd": "/", "path": [],
                                   "executable": "/usr/bin/false", "version": sys.version}, [0, 1, 2])
        reply = json.loads(sock.makefile("rb").readline())
    assert "/usr/bin/false" in reply["refused"] and sys.executable in reply["refused"]


def test_the_zygote_ends_with_the_process_that_started_it(tmp_path):
    owner = subprocess.Popen(
        [sys.executable, "-c", "from ml_assets.trainer import zygote; import time; "
                               "print(zygote.address(), flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, env=toy.cli_env())
    try:
        path = owner.stdout.readline().strip()
        assert path.startswith("@") and reachable(path), path
        (server,) = toy.descendants(owner.pid)
        started = processes.start_ticks(server)
        owner.kill()
        owner.wait()
        toy.wait_for(lambda: not processes.is_alive(server, started), 5, "the zygote to follow its owner")
        toy.wait_for(lambda: not reachable(path), 5, "its socket to go")
    finally:
        owner.kill()


def test_rank_start_exec_means_no_zygote_and_a_bad_value_is_named(monkeypatch, tmp_path):
    from ml_assets.settings import SettingsError, load_settings

    monkeypatch.setenv(zygote.RANK_START_ENV, "exec")
    assert zygote.address() is None
    monkeypatch.setenv(zygote.RANK_START_ENV, "spawn")
    with pytest.raises(ValueError, match="ML_ASSETS_RANK_START='spawn'"):
        zygote.address()
    monkeypatch.setenv("ML_ASSETS_HOME", str(tmp_path))
    with pytest.raises(SettingsError, match="ML_ASSETS_RANK_START='spawn' is not one of"):
        load_settings()


@pytest.mark.parametrize(("written", "grace"), [
    ({"orphan_grace_seconds": 1.5}, 1.5),
    ({}, 5.0),  # the config's default
    ({"orphan_grace_seconds": 0}, 5.0),  # invalid: the rank names it; the client keeps the default
    ("not json", 5.0),
    (None, 5.0),  # no such file
])
def test_a_forked_client_bounds_its_rank_by_the_configs_orphan_grace(tmp_path, written, grace):
    # The rank follows its client, not torchrun's agent: when the agent dies, the client's grace is
    # what bounds the rank's checkpoint-then-exit, so it must be the config's, not the 60 s maximum.
    from ml_assets.trainer import forked as client

    config = tmp_path / "config.json"
    if written is not None:
        config.write_text(written if isinstance(written, str) else json.dumps(written))
    assert client._orphan_grace(["--config", str(config)]) == grace
    assert client._orphan_grace(["--config"]) == client._orphan_grace([]) == 5.0


def test_a_rank_whose_zygote_died_mid_training_ends_with_its_own_exit_code(tmp_path):
    # The zygote dies with its owner (the launcher's daemon, restarted while a model trains). The rank
    # trains on; its client then can no longer hear the exit status from the zygote and used to exit
    # as failed, so torchrun (restarts allowed) trained the finished model a second time.
    owner = subprocess.Popen(
        [sys.executable, "-c", "from ml_assets.trainer import zygote; import time; "
                               "print(zygote.address(), flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True, env=toy.cli_env())
    data = toy.toy_data(tmp_path / "data", train_rows=60_000)
    config = tmp_path / "config.json"
    toy.write_config(config, data, output_dir=str(tmp_path / "out"), epochs=3, seed=5)
    home, log, agent = tmp_path / "home", tmp_path / "log", None
    try:
        path = owner.stdout.readline().strip()
        (server,) = toy.descendants(owner.pid)
        agent = toy.start(forked(toy.torchrun_args(config, max_restarts=2)), log, ML_ASSETS_HOME=str(home),
                          **{zygote.SOCKET_ENV: path})
        toy.wait_for(lambda: len(toy.training_ranks(home)) == 1, 60, "the forked rank")
        (rank,) = toy.training_ranks(home)
        rank_started, server_started = processes.start_ticks(rank), processes.start_ticks(server)
        owner.kill()
        toy.wait_for(lambda: not processes.is_alive(server, server_started), 5, "the zygote to follow its owner")
        assert processes.is_alive(rank, rank_started), "the rank ended before its zygote: nothing was tested"
        assert agent.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        owner.kill()
        if agent is not None:
            toy.kill_tree(agent)
    stderr = log.read_text()
    assert f"the trainer zygote exited before rank {rank}, which said it ended with code 0" in stderr
    assert "starting the rank in this process" not in stderr  # trained once: torchrun restarted nothing
    assert (tmp_path / "out" / "model.safetensors").exists()
