"""torchrun starts every multi-process mode `packtrain launch` does (issue 51, item 13),
with the project's own torch: torchrun's agent serves the c10d store and tells the
workers so (TORCHELASTIC_USE_AGENT_STORE=True), so every rank — rank 0 too — connects
to it as a client, as c10d's env:// initialization does. Static and --standalone
rendezvous, two ranks: data-parallel `train`, member-parallel `train` and `multitask
train --pipeline-stages 2` each end where the same run under `packtrain launch` ends.
A rank that fails writes its error where TORCHELASTIC_ERROR_FILE says, so torchrun's
summary names it."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CLI = os.environ.get("PACKTRAIN_BINARY")
ROOT = Path(__file__).resolve().parents[2]
# Absolute: the runs start in their test's directory.
ENV = {**os.environ, "PACKTRAIN_DATA_DIR": str(Path(os.environ.get("PACKTRAIN_DATA_DIR", ROOT / "data")).resolve())}
pytestmark = pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_json(out):
    """The run's JSON report in `out` (launch prefixes each rank's lines with "[rank r] ")."""
    text = "\n".join(line[9:] if line.startswith("[rank 0] ") else line for line in out.splitlines()
                     if not line.startswith("[rank 1] "))
    start = text.find("{")
    assert start >= 0, out
    return json.loads(text[start:text.rfind("}") + 1])


def torchrun(args, standalone, cwd):
    rendezvous = ["--standalone"] if standalone else ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return subprocess.run([*TORCHRUN, "--nproc-per-node", "2", *rendezvous, "--no-python", CLI, "--threads", "1",
                           *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=ENV)


def launch(args, cwd):
    return subprocess.run([CLI, "--threads", "1", "launch", "--nproc", "2", "--", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=300, env=ENV)


def same_report(a, b):
    for key in ("members", "test_metrics", "dev_metrics"):
        if key in a or key in b:
            assert a.get(key) == b.get(key), key


TRAIN = ["train", "--members", "4", "--epochs", "3", "--hidden", "16", "--batch", "64", "--device", "cpu",
         "--patience", "0", "--json", "--quiet"]


@pytest.mark.parametrize("standalone", [False, True], ids=["static", "standalone"])
def test_data_parallel_train_under_torchrun_equals_launch(tmp_path, standalone):
    ours = launch(TRAIN, tmp_path)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    theirs = torchrun(TRAIN, standalone, tmp_path)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    same_report(last_json(theirs.stdout), last_json(ours.stdout))


def test_member_parallel_train_under_torchrun_equals_launch(tmp_path):
    args = TRAIN + ["--member-parallel", "--recalibrate", "none"]
    ours = launch(args + ["--checkpoint", tmp_path / "a.ckpt"], tmp_path)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    theirs = torchrun([*map(str, args), "--checkpoint", str(tmp_path / "b.ckpt")], False, tmp_path)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    same_report(last_json(theirs.stdout), last_json(ours.stdout))


def test_multitask_pipeline_under_torchrun_equals_launch(tmp_path):
    words = ["the cat", "a dog ran", "on the mat", "it sat"]
    rows = lambda n: "".join(f"src\t{i % 2}\t\t{'yes' if i % 2 else 'no'} {words[i % 4]}.\n" for i in range(n))
    (tmp_path / "train.tsv").write_text(rows(24))
    (tmp_path / "dev.tsv").write_text(rows(8))
    args = ["multitask", "train", "--width", "16", "--layers", "2", "--heads", "2", "--max-length", "32", "--batch",
            "4", "--buckets", "16,32", "--device", "cpu", "-q", "--epochs", "2", "--train", "train.tsv", "--dev",
            "dev.tsv", "--json", "--pipeline-stages", "2", "--micro-batches", "2"]
    ours = launch(args + ["-o", "a.ckpt"], tmp_path)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    theirs = torchrun(args + ["-o", "b.ckpt"], True, tmp_path)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    a, b = last_json(theirs.stdout), last_json(ours.stdout)
    assert a["dev_metrics"] == b["dev_metrics"]


def test_a_failing_rank_tells_torchrun_why(tmp_path):
    failed = torchrun(["train", "--data", str(tmp_path / "missing.csv"), "--device", "cpu"], True, tmp_path)
    assert failed.returncode != 0
    assert "packtrain: error:" in failed.stderr and "missing.csv" in failed.stderr, failed.stderr
    # torchrun's summary quotes the rank's error file (without it: "To enable traceback see ...").
    assert "To enable traceback" not in failed.stderr, failed.stderr
