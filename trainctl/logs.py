"""The logs of a Ray job or of Ray pods, collected (LogCollector) from the Kubernetes API and the head pod,
and the Ray session worker logs inside each worker pod, where the Ray Train actors' NCCL lines are
(trainctl/commands/logs.py is the command).
"""

from __future__ import annotations

import codecs
import queue
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from trainctl.eks_auth import Target
from trainctl.kube import (
    WORKER,
    KubeError,
    Pod,
    exec_in_pod,
    find_head_pod,
    list_pods,
    pod_log,
    ray_selector,
)
from trainctl.progress import Progress, TextSink
from trainctl.ray_jobs import logs_command

# Ray Train workers are actors: their stdout/stderr, NCCL's INFO lines included, go to
# /tmp/ray/session_*/logs/worker-*.out|err inside each worker pod, never to the container log (Ray's logging
# docs; the AWS Ray Train DLC sample greps these files through kubectl exec). The script prints each file after a
# line holding \x1e and its name; exit 3 when the pod has no worker logs (yet).
RAY_TEMP_DIR = "/tmp/ray"
SESSION_LOGS_SCRIPT = r"""root="$1"; found=0
for f in "$root"/session_latest/logs/worker-*.out "$root"/session_latest/logs/worker-*.err; do
  [ -f "$f" ] || continue
  found=1
  printf '\036%s\n' "${f##*/}"
  cat "$f" || exit 1
  printf '\n'
done
[ "$found" = 1 ] || { echo "no Ray worker logs under $root/session_latest/logs" >&2; exit 3; }
"""
NO_SESSION_LOGS = 3


def session_logs_command(ray_temp_dir: str = RAY_TEMP_DIR) -> list[str]:
    return ["sh", "-c", SESSION_LOGS_SCRIPT, "sh", ray_temp_dir]


class LogCollector:
    """Chunks of several logs, cut into lines: printed (with a per-source prefix) and/or kept."""

    def __init__(self, out: TextIO | None = None, *, prefix: bool = False, echo: bool = True, keep: bool = False):
        self._out = out
        self._prefix = prefix
        self._echo = echo
        self._keep = keep
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._partial: dict[str, str] = {}
        self.lines: dict[str, list[str]] = {}

    def feed(self, source: str, data: bytes) -> None:
        decoder = self._decoders.setdefault(source, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        self._add(source, decoder.decode(data))

    def end(self, source: str) -> None:
        decoder = self._decoders.pop(source, None)
        if decoder is not None:
            self._add(source, decoder.decode(b"", final=True))
        rest = self._partial.pop(source, "")
        if rest:
            self._emit(source, [rest])

    def _add(self, source: str, text: str) -> None:
        self.lines.setdefault(source, [])
        if not text:
            return
        pieces = (self._partial.pop(source, "") + text).split("\n")
        if pieces[-1]:
            self._partial[source] = pieces[-1]
        self._emit(source, pieces[:-1])

    def _emit(self, source: str, lines: list[str]) -> None:
        if self._keep:
            self.lines[source].extend(lines)
        if self._echo and lines:
            out = self._out if self._out is not None else sys.stdout
            lead = f"[{source}] " if self._prefix else ""
            out.write("".join(f"{lead}{line}\n" for line in lines))
            out.flush()


@dataclass
class Collected:
    collector: LogCollector
    errors: list[str] = field(default_factory=list)


def _source(pod: Pod, container: str) -> str:
    return f"pod/{pod.name}/{container}"


def _container(pod: Pod, wanted: str | None) -> str:
    if wanted is None:
        return pod.container
    if wanted not in pod.containers:
        raise KubeError(f"pod {pod} has no container {wanted!r} (it has: {', '.join(pod.containers)})")
    return wanted


def read_pods(
    target: Target,
    pods: Iterable[Pod],
    collector: LogCollector,
    *,
    container: str | None = None,
    follow: bool = False,
    previous: bool = False,
) -> list[str]:
    """Logs of the pods into the collector: one after the other, or all at once when following. Errors per pod."""
    errors: list[str] = []
    jobs: list[tuple[Pod, str]] = []
    for pod in pods:
        try:
            jobs.append((pod, _container(pod, container)))
        except KubeError as exc:
            errors.append(str(exc))

    def read(pod: Pod, name: str, sink: Any) -> None:
        source = _source(pod, name)
        for chunk in pod_log(target.api, pod, name, follow=follow, previous=previous, timeout=target.request_timeout):
            sink(source, chunk)

    if not follow:
        for pod, name in jobs:
            try:
                read(pod, name, collector.feed)
            except KubeError as exc:
                errors.append(str(exc))
            finally:
                collector.end(_source(pod, name))
        return errors
    chunks: queue.Queue[tuple[str, bytes | KubeError | None]] = queue.Queue()

    def pump(pod: Pod, name: str) -> None:
        try:
            read(pod, name, lambda source, chunk: chunks.put((source, chunk)))
        except KubeError as exc:
            chunks.put((_source(pod, name), exc))
        finally:
            chunks.put((_source(pod, name), None))

    for pod, name in jobs:
        threading.Thread(target=pump, args=(pod, name), name=f"logs {pod}", daemon=True).start()
    active = len(jobs)
    while active:
        source, item = chunks.get()
        if isinstance(item, KubeError):
            errors.append(str(item))
        elif item is None:
            active -= 1
            collector.end(source)
        else:
            collector.feed(source, item)
    return errors


def read_job(
    target: Target,
    submission_id: str,
    collector: LogCollector,
    *,
    follow: bool = False,
    progress: Progress | None = None,
) -> list[str]:
    """`ray job logs ID` in the head pod, into the collector as source job/ID."""
    head = find_head_pod(target.api, target.namespace, target.ray_cluster, timeout=target.request_timeout)
    source = f"job/{submission_id}"
    progress = progress or Progress()
    result = exec_in_pod(
        target.api,
        head,
        logs_command(submission_id, follow=follow),
        on_stdout=lambda chunk: collector.feed(source, chunk),
        capture=False,
        on_stderr=TextSink(sys.stderr),
        on_idle=progress.idle(f"job {submission_id}'s log") if follow else None,
    )
    collector.end(source)
    if not result.ok:
        return [f"`ray job logs {submission_id}` in {head} failed: {result.why()} (is the submission id right?)"]
    return []


def read_session_logs(target: Target, pods: Iterable[Pod], collector: LogCollector) -> list[str]:
    """The Ray session worker logs (the actors' output) of each pod, one source per file:
    pod/NAME/session:worker-....out. A pod without worker logs adds nothing (the analyzer's rank count shows it)."""
    errors: list[str] = []
    for pod in pods:
        try:
            result = exec_in_pod(target.api, pod, session_logs_command())
        except KubeError as exc:
            errors.append(str(exc))
            continue
        if result.exit_code == NO_SESSION_LOGS:
            continue
        if not result.ok:
            errors.append(f"Ray session logs in pod {pod}: {result.why()}")
            continue
        source = None
        for line in result.stdout.decode(errors="replace").split("\n"):
            if line.startswith("\x1e"):
                if source is not None:
                    collector.end(source)
                source = f"pod/{pod.name}/session:{line[1:]}"
            elif source is not None:
                collector.feed(source, f"{line}\n".encode())
        if source is not None:
            collector.end(source)
    return errors


def worker_pods(target: Target) -> list[Pod]:
    selector = ray_selector(WORKER, target.ray_cluster)
    pods = list_pods(target.api, target.namespace, selector, timeout=target.request_timeout)
    if not pods:
        raise KubeError(
            f"no Ray worker pods in namespace {target.namespace} (-l {selector}); is the RayCluster up "
            "(or pass the RayJob's cluster with --ray-cluster)?"
        )
    return pods
