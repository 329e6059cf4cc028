"""The dev cluster and the certificates never touch what they do not own (issue 21)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.pki import PKIError, create_ca, create_pki, private_folder
from gpufleet.testing.cluster import STATE_FILE, ControlPlane
from gpufleet.testing.process_record import ProcessRecord


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process that leads its own process group, as a cluster process would."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    yield process
    process.kill()
    process.wait()


def _state(folder: Path, processes: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    state = {"bin_dir": "/nonexistent", "ports": {"apiserver": 1}, "processes": processes}
    (folder / STATE_FILE).write_text(json.dumps(state))


def _down(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "dev", "cluster", "down", "--work-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_down_leaves_a_process_alone_whose_pid_a_stale_state_folder_names(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    record = ProcessRecord.of(bystander.pid)
    assert record is not None
    # the pid reused by another process: same pid, another start time and executable
    reused = {"pid": bystander.pid, "started": record.started - 1, "exe": "/usr/bin/etcd"}
    _state(tmp_path / "reused", {"etcd": {**reused, "boot": record.boot}})
    # the state of a run before the machine restarted
    _state(tmp_path / "rebooted", {"etcd": {**record.dump(), "boot": "another-boot"}})
    # an older state file that only has the pid
    older = tmp_path / "older"
    older.mkdir()
    (older / STATE_FILE).write_text(
        json.dumps({"bin_dir": "/x", "ports": {}, "pids": {"etcd": bystander.pid}})
    )
    for folder, why in (
        (tmp_path / "reused", "is now another process"),
        (tmp_path / "rebooted", "before the machine restarted"),
        (older, "can be identified"),
    ):
        result = _down(folder)
        print(f"$ gpufleet dev cluster down --work-dir {folder.name}\n{result.stderr.strip()}")
        assert result.returncode == 0, result.stderr
        assert why in " ".join(result.stderr.split()), result.stderr
        assert bystander.poll() is None, f"down with a {folder.name} state folder killed it"
        assert not (folder / STATE_FILE).exists(), "a stale record is removed"


def test_down_stops_a_process_it_recorded_itself(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    try:
        record = ProcessRecord.of(process.pid)
        assert record is not None
        _state(tmp_path, {"etcd": record.dump()})
        plane = ControlPlane.attach(tmp_path)
        assert plane is not None and plane.running()
        result = _down(tmp_path)
        assert result.returncode == 0, result.stderr
        assert process.wait(timeout=20) is not None
    finally:
        process.kill()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_keys_are_never_readable_by_others(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: files would be created 0644
    try:
        pki = create_pki(tmp_path / "pki")
    finally:
        os.umask(old)
    assert _mode(pki.folder) == 0o700
    for key in (pki.ca_key, pki.server_key, pki.admin_key, pki.sa_key):
        assert _mode(key) == 0o600, key
    # the webhook needs a CA and its serving certificate, nothing else
    ca = create_ca(tmp_path / "webhook")
    assert sorted(p.name for p in ca.folder.iterdir()) == ["ca.crt", "ca.key"]
    assert _mode(ca.ca_key) == 0o600


def test_keys_are_created_private_from_the_first_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No moment in which a key is readable by others: the file is opened with its mode."""
    modes: list[int] = []
    real_open = os.open

    def watching_open(path: str, flags: int, mode: int = 0o777, *args: object) -> int:
        fd = real_open(path, flags, mode, *args)
        if str(path).endswith(".key"):
            modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", watching_open)
    create_ca(tmp_path / "ca")
    assert modes == [0o600]


def test_a_certificate_folder_others_can_read_or_own_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PKIError, match=r"shared.*0755.*chmod 700"):
        create_ca(shared)
    assert not (shared / "ca.key").exists()
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    with pytest.raises(PKIError, match="belongs to user"):
        private_folder(mine, owner=os.getuid() + 1)
    private_folder(mine)  # the right owner and mode: accepted
