from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.nvrx_runs import NvrxRun, launch, store_addr
from tests.training.tiny import corpus_lines, save_tiny_model


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), corpus_lines())


# The NVRx runs, once per session: tests/training/test_nvrx_fsdp.py checks their recovery and results,
# test_goodput_runs.py the goodput ledger of their journals, both on the same processes' output.


@pytest.fixture(scope="session")
def nvrx_reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NvrxRun:
    return launch(tmp_path_factory.mktemp("reference"), tiny_model_dir)


@pytest.fixture(scope="session")
def nvrx_sigkill(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NvrxRun:
    return launch(
        tmp_path_factory.mktemp("sigkill"), tiny_model_dir, "--fault", "kill", "--fault-step", "6", "--fault-rank", "1"
    )


@pytest.fixture(scope="session")
def nvrx_exception(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NvrxRun:
    return launch(
        tmp_path_factory.mktemp("exception"),
        tiny_model_dir,
        *(
            "--fault",
            "exception",
            "--fault-step",
            "6",
            "--fault-rank",
            "1",
            "--inprocess",
            "--store-addr",
            store_addr(),
        ),
        *("--inprocess-soft-timeout", "5", "--inprocess-hard-timeout", "10", "--inprocess-barrier-timeout", "20"),
        max_restarts=0,  # the job only succeeds if the Wrapper recovers without the launcher
    )


@pytest.fixture(scope="session")
def nvrx_hang(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NvrxRun:
    heartbeats = ("--ft-rank-heartbeat-timeout", "5", "--ft-initial-rank-heartbeat-timeout", "60")
    return launch(
        tmp_path_factory.mktemp("hang"),
        tiny_model_dir,
        *("--fault", "hang", "--fault-step", "5", "--fault-rank", "0"),
        ft=(*heartbeats, "--ft-workload-check-interval", "1"),
    )


@pytest.fixture(scope="session")
def nvrx_kill_during_save(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> NvrxRun:
    return launch(
        tmp_path_factory.mktemp("kill-during-save"),
        tiny_model_dir,
        *("--fault", "kill-during-save", "--fault-step", "6", "--fault-rank", "1", "--ckpt-slow-write-s", "1"),
    )
