"""`python -m training.fabric_analyzer` and `trainctl fabric-check`: output, stdin, exit codes.

Each entry point runs as a real process once (its exit code, stdin and streams, test_real_processes_...); the other
tests call the same `main` in this process, with stdin, stdout and stderr swapped and SystemExit read as the exit
code, which is what the process would do (each real process costs a torch-free interpreter start, 1 to 5 s here)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from tests.fabric_analyzer.test_corpus import CORPUS
from trainctl import cli
from trainctl.commands import fabric_check
from training import fabric_analyzer

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60

EFA_LOG = CORPUS / "efa_ofi1.13_new_wording_kubectl_prefix.log"
MIXED_LOG = CORPUS / "mixed_one_of_four_ranks_socket.log"
DEGRADED_LOG = CORPUS / "degraded_tcp_ofi_rxm_ofi1.4.log"
UNKNOWN_LOG = CORPUS / "unknown_coll_subsys_only.log"

COMMANDS = {
    "module": [sys.executable, "-m", "training.fabric_analyzer"],
    "trainctl": [sys.executable, "-m", "trainctl", "fabric-check"],
}
MAINS: dict[str, Callable[[Sequence[str]], int]] = {
    "module": fabric_analyzer.main,
    "trainctl": lambda argv: cli.main(["fabric-check", *argv]),
}


def run_process(command: str, *args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMANDS[command], *map(str, args)],
        cwd=ROOT,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def run(command: str, *args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command's `main` in this process, as the process would run it (stdin, streams, exit code)."""
    out, err = io.StringIO(), io.StringIO()
    fake_stdin = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")
    saved = sys.stdin
    sys.stdin = fake_stdin
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = MAINS[command]([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = saved
    return subprocess.CompletedProcess([command, *map(str, args)], int(code), out.getvalue(), err.getvalue())


def as_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(done.stdout)
    assert document["exit_code"] == done.returncode
    assert done.stderr == ""
    return document


@pytest.fixture(params=sorted(COMMANDS))
def command(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def test_real_processes_read_stdin_and_exit_with_the_verdicts_code(command: str) -> None:
    done = run_process(command, "--json", "-", stdin=MIXED_LOG.read_text(encoding="utf-8"))
    assert (done.returncode, json.loads(done.stdout)["sources"]) == (1, ["<stdin>"])
    bad = run_process(command, "--no-such-flag")
    assert bad.returncode == 2
    assert "usage:" in bad.stderr


def test_all_efa_exits_0_with_a_table(command: str) -> None:
    done = run(command, EFA_LOG)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["HOST", "PID", "RANK", "DEV", "VERDICT", "REASON"]
    assert [line.split()[4] for line in lines[1:5]] == ["efa"] * 4
    assert lines[-1] == "PASS: all 4 rank(s) used EFA (aws-ofi-nccl, provider efa)"


def test_one_rank_on_sockets_exits_1_and_names_it(command: str) -> None:
    done = run(command, MIXED_LOG)
    assert done.returncode == 1
    rows = {line.split()[0]: line.split()[4] for line in done.stdout.splitlines()[1:5]}
    assert rows == {"ip-10-1-40-12": "efa", "ip-10-1-40-77": "efa", "ip-10-1-41-5": "efa", "ip-10-1-43-190": "socket"}
    assert "ip-10-1-43-190:5307 rank 3 (socket):" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("FAIL: 1 of 4 rank(s) fell back from EFA (1 socket)")


def test_degraded_exits_1(command: str) -> None:
    document = as_json(run(command, "--json", DEGRADED_LOG))
    assert (document["verdict"], document["exit_code"]) == ("degraded", 1)
    assert {r["provider"] for r in document["ranks"]} == {"tcp;ofi_rxm"}


def test_no_evidence_exits_3(command: str) -> None:
    done = run(command, UNKNOWN_LOG)
    assert done.returncode == 3
    assert "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET" in done.stdout.splitlines()[-1]


def test_empty_stdin_exits_3(command: str) -> None:
    done = run(command, stdin="")
    assert done.returncode == 3
    assert done.stdout.startswith("UNKNOWN: no NCCL log lines")


def test_unreadable_file_exits_2(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.log"
    done = run(command, EFA_LOG, missing)
    assert done.returncode == 2
    assert f"error: cannot read {missing}: No such file or directory" in done.stderr
    assert "PASS" not in done.stdout
    document = as_json(run(command, "--json", missing, EFA_LOG))
    assert document["exit_code"] == 2
    assert document["errors"] == [f"cannot read {missing}: No such file or directory"]
    assert len(document["ranks"]) == 4


def test_a_directory_is_unreadable(command: str, tmp_path: Path) -> None:
    assert run(command, tmp_path).returncode == 2


def test_bad_arguments_exit_2(command: str) -> None:
    done = run(command, "--no-such-flag")
    assert done.returncode == 2
    assert "usage:" in done.stderr


@pytest.mark.parametrize("dash", [False, True])
def test_stdin(command: str, dash: bool) -> None:
    text = MIXED_LOG.read_text(encoding="utf-8")
    document = as_json(run(command, "--json", *(["-"] if dash else []), stdin=text))
    assert (document["verdict"], document["exit_code"], document["sources"]) == ("socket", 1, ["<stdin>"])
    socket = [r for r in document["ranks"] if r["verdict"] == "socket"]
    assert [(r["host"], r["pid"], r["rank"]) for r in socket] == [("ip-10-1-43-190", 5307, 3)]
    assert {e["source"] for e in socket[0]["evidence"]} == {"<stdin>"}


def test_files_and_stdin_together(command: str) -> None:
    document = as_json(run(command, "--json", EFA_LOG, "-", stdin=DEGRADED_LOG.read_text(encoding="utf-8")))
    assert document["counts"] == {"efa": 4, "degraded": 2, "socket": 0, "unknown": 0}
    assert document["exit_code"] == 1
    assert document["sources"] == [str(EFA_LOG), "<stdin>"]


def test_json_output(command: str) -> None:
    document = as_json(run(command, "--json", MIXED_LOG))
    assert document["verdict"] == "socket"
    assert [(r["rank"], r["verdict"]) for r in document["ranks"]] == [(0, "efa"), (1, "efa"), (2, "efa"), (3, "socket")]
    for rank in document["ranks"]:
        for evidence in rank["evidence"]:
            lines = MIXED_LOG.read_text(encoding="utf-8").splitlines()
            assert lines[evidence["line"] - 1].strip() == evidence["text"]


def test_invalid_utf8_is_read(command: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_bytes(b"\xff\xfe garbage\n" + EFA_LOG.read_bytes())
    assert run(command, log).returncode == 0


def test_help_documents_exit_codes(command: str) -> None:
    done = run(command, "--help")
    assert done.returncode == 0
    for words in ("0 every rank used EFA", "1 fallback detected", "2 could not run", "3 no evidence", "--json"):
        assert words in " ".join(done.stdout.split())


# --- trainctl in-process ----------------------------------------------------------------------


def test_trainctl_main_returns_0_and_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fabric-check", str(EFA_LOG)]) == 0
    assert cli.main(["fabric-check", "--json", str(MIXED_LOG)]) == 1
    document = json.loads(
        capsys.readouterr().out.split("PASS: all 4 rank(s) used EFA (aws-ofi-nccl, provider efa)\n")[1]
    )
    assert document["verdict"] == "socket"


def test_trainctl_main_exits_3_and_2() -> None:
    assert cli.main(["fabric-check", str(UNKNOWN_LOG)]) == 3
    assert cli.main(["fabric-check", str(CORPUS / "no-such.log")]) == 2


def test_add_parser_registers_run() -> None:
    parser = argparse.ArgumentParser()
    fabric_check.add_parser(parser.add_subparsers())
    args = parser.parse_args(["fabric-check", "--json", "a.log", "-"])
    assert (args.run, args.files, args.json) == (fabric_check.run, ["a.log", "-"], True)
