"""save() follows the CLI's policy for special files: a character device or a FIFO is
written in place (never replaced by a renamed temporary), a socket is refused.

Device nodes, FIFOs and sockets are made in pytest's temporary directory; the real
/dev is never touched."""
import os
import socket
import stat
import threading

import numpy as np
import pytest

import packtrain


def fitted():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=80)
    return packtrain.EnsembleRegressor(members=2, hidden=8, epochs=2, batch_size=16, device="cpu").fit(X, y)


def test_save_into_a_character_device_writes_in_place(tmp_path):
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError as e:
        pytest.skip(f"cannot make a device node here: {e}")
    fitted().save(null)
    mode = os.lstat(null).st_mode
    assert stat.S_ISCHR(mode), "save() replaced the device node with a file"
    assert os.lstat(null).st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"], "no temporary left beside it"


def test_save_into_a_fifo_gives_the_reader_the_checkpoint(tmp_path):
    model = fitted()
    model.save(tmp_path / "file.ckpt")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("bytes", open(fifo, "rb").read()))
    reader.start()
    model.save(fifo)
    reader.join(timeout=60)
    assert got["bytes"] == (tmp_path / "file.ckpt").read_bytes()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_save_refuses_a_socket(tmp_path):
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        with pytest.raises(Exception, match="is a socket"):
            fitted().save(path)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
