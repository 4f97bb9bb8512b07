"""`trainctl rehearse FILE|DIR...`: run the manifests you will apply as pods on this machine, on CPU.

Every Job (Indexed too), RayJob and RayCluster in the files runs as isolated pods (own mount, PID,
UTS and network namespaces; emptyDir private to a pod, one shared directory per PVC claim, ConfigMap
files, per-pod /etc/hosts with Service and pod DNS names) with Job and KubeRay semantics. Pods get
PLATFORM_REHEARSAL=cpu, which the training code honours to use CPU and gloo; GPU and EFA requests are
reported, not satisfied, and images are not pulled (this machine's Python environment runs instead, or, with
--image-python, the environment make image-envs built for that image with its Python and package versions).
Needs Linux and root (or unprivileged user namespaces).

Input is strict, as `kubectl apply --validate=strict`: every object is checked against the Kubernetes
1.36 schema and the vendored KubeRay/Kueue CRDs, and every workload field against the rehearsal's
support table (docs/rehearsal-support.md) before anything runs. What only the image has (an absolute command
this machine lacks, a container without a command, runtime_env pip pins this environment does not
satisfy) and models or data from a hub are refused up front too, naming the fix.

With --env E the pods run on a simulated cluster of environment E, built from infra/spec
(rehearse/cluster): its system nodes and the GPU nodes --nodes asks for, kube-scheduler's filters
(a pod that fits no node stays Pending with kube-scheduler's message), Kueue v0.19.2 admission for
labelled workloads, and node loss with --kill-node. Times, --timeout included, are then cluster
seconds; --time-scale X makes every controller timeout run X times faster.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from k8s.images import ImageLock
from rehearse import Kill, Options, RehearsalError, format_table, run
from rehearse.admission import Admission, InputError, admit
from rehearse.manifests import ManifestError, load
from rehearse.scale import SCALES, parse_pairs
from trainctl import flags
from trainctl.exit_codes import ExitCode

EPILOG = """exit codes:
  0    every workload ran and completed (or became Ready)
  1    a workload failed or timed out
  2    could not run: bad input (schema, API server rules), a kind or field the rehearsal does not
       emulate, a command, package or model only the image or a hub has, no namespaces on this machine
  3    --skip-unsupported skipped something (listed as SKIPPED) and everything that ran completed:
       not everything was judged
  130  interrupted (Ctrl-C): every pod was stopped; the pods that ran and their last states are printed"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rehearse",
        help="run Jobs, RayJobs and RayClusters from manifests as isolated pods on this machine, on CPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    parser.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="Kubernetes YAML or JSON files or directories"
    )
    parser.add_argument(
        "-R", "--recursive", action="store_true", help="read directories recursively (as kubectl apply -R)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="whole run (default: %(default)s)")
    flags.add_output(parser)
    parser.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="POD@SECONDS[,after=PATH]",
        help="kill the pod (name or hostname prefix) SECONDS into the run, or SECONDS after PATH (relative to "
        "--output-dir, e.g. a committed checkpoint on a claim) first exists, as a node loss would; repeatable",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="per-pod logs and volumes (default: a new temp dir)"
    )
    parser.add_argument(
        "--pod-backoff",
        type=float,
        default=10.0,
        metavar="S",
        help="delay before replacing a failed Job pod, doubling per failure (Kubernetes: 10)",
    )
    parser.add_argument(
        "--host-path",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a host directory every pod sees read-only at the same path (e.g. a local model); repeatable",
    )
    flags.add_env(
        parser,
        required=False,
        help="run on environment ENV's cluster: its nodes, kube-scheduler, Kueue",
    )
    parser.add_argument(
        "--nodes",
        action="append",
        default=[],
        type=_group_count,
        metavar="GROUP=N",
        help="with --env: N nodes in GPU group GROUP, and its Kueue quota for N nodes, as `trainctl scale` leaves "
        "them (default: the group's desired_size, as deployed: 0 for on-demand GPU groups); repeatable",
    )
    parser.add_argument(
        "--quota",
        action="append",
        default=[],
        type=_group_count,
        metavar="GROUP=N",
        help="with --env: GROUP's Kueue quota covers N nodes instead of its --nodes count, to rehearse quota "
        "and nodes that differ (a node group reset by cdk deploy, capacity short); repeatable",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="with --env: cluster seconds per wall second, every controller timeout X times faster (default 1)",
    )
    parser.add_argument(
        "--kill-node",
        action="append",
        default=[],
        metavar="NODE@SECONDS[,after=PATH]",
        help="with --env: lose NODE (an alias such as g6-0, or its name) at SECONDS cluster time, or SECONDS after "
        "PATH (relative to --output-dir, e.g. a committed checkpoint on a claim) first exists; repeatable",
    )
    parser.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="skip kinds and workloads the rehearsal does not emulate (listed as SKIPPED; exit 3, never 0)",
    )
    parser.add_argument(
        "--scale",
        choices=SCALES,
        default="full",
        help="small: the project's own workloads (training.nvrx_fsdp, training.ray_finetune) train the tiny "
        "model built locally for a few steps with small batches; every rewrite is printed (default: full)",
    )
    parser.add_argument(
        "--ranks-per-pod",
        type=int,
        default=None,
        metavar="N",
        help="at most N training processes per pod where a workload starts one per GPU (ft_launcher and torchrun "
        "--nproc-per-node, Ray's num-gpus and --num-workers); the pods' GPU requests stay as written; every "
        "rewrite is printed (default: as written)",
    )
    parser.add_argument(
        "--substitute",
        action="append",
        default=[],
        metavar="REF=LOCAL_PATH",
        help="use a local copy for a hub model or data id, or a URL, in the workloads' commands; repeatable",
    )
    parser.add_argument(
        "--command-path",
        action="append",
        default=[],
        metavar="IMAGE_PATH=LOCAL_PATH",
        help="run LOCAL_PATH where a container's command is IMAGE_PATH, an absolute path only the image has; "
        "repeatable",
    )
    parser.add_argument(
        "--image-python",
        action="append",
        default=[],
        metavar="IMAGE=PYTHON",
        help="run IMAGE's containers (a name in k8s/images.lock.json, e.g. nvrx-train, or an image reference) with "
        "PYTHON's environment first on PATH, e.g. .venv-nvrx-train/bin/python from make image-envs; repeatable",
    )
    parser.set_defaults(run=run_command)


def image_pythons(pairs: list[str], lock: ImageLock) -> dict[str, Path]:
    """--image-python values as Options.image_python: image reference -> interpreter (a venv's, not resolved)."""
    out = {}
    for pair in pairs:
        image, sep, python = pair.partition("=")
        if not sep or not image or not python:
            raise RehearsalError(
                f"--image-python {pair!r}: write it as IMAGE=PYTHON, IMAGE a name in k8s/images.lock.json "
                f"({', '.join(sorted(lock.images))}) or an image reference"
            )
        out[lock.get(image).reference if image in lock.images else image] = Path(python).absolute()
    return out


def _report(admission: Admission) -> None:
    for line in admission.notes:
        print(f"note: {line}")
    for skipped in admission.skipped:
        print(str(skipped))


_POD_LINE = re.compile(r"^pod (?P<pod>\S+) (?P<what>started|ended: .*)")


@dataclass
class Progress:
    """The run's progress lines (stderr unless --json), and each pod's last state, for a Ctrl-C report."""

    echo: bool
    started: float = field(default_factory=time.monotonic)
    pods: dict[str, str] = field(default_factory=dict)

    def log(self, line: str) -> None:
        m = _POD_LINE.match(line)
        if m:
            self.pods[m.group("pod")] = "running" if m.group("what") == "started" else m.group("what")
        if self.echo:
            print(line, file=sys.stderr, flush=True)


def interrupted(progress: Progress | None, as_json: bool) -> None:
    pods = progress.pods if progress else {}
    seconds = time.monotonic() - progress.started if progress else 0.0
    states = {pod: "stopped by Ctrl-C" if state == "running" else state for pod, state in pods.items()}
    if as_json:
        document = {"interrupted": True, "exit_code": int(ExitCode.INTERRUPTED), "wall_s": round(seconds, 2)}
        print(json.dumps({**document, "pods": states}, indent=2))
        return
    print(f"interrupted (Ctrl-C) after {seconds:.1f} s: every pod was stopped; {len(states)} pod(s) ran")
    for pod, state in states.items():
        print(f"  {pod}  {state}")


def _group_count(text: str) -> tuple[str, int]:
    from rehearse.cluster.session import parse_nodes

    try:
        return parse_nodes(text)
    except RehearsalError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def run_command(args: argparse.Namespace) -> int:
    progress: Progress | None = None
    try:
        manifests = load(args.files, recursive=args.recursive)
        try:
            substitutes = parse_pairs(args.substitute, "--substitute")
            command_paths = parse_pairs(args.command_path, "--command-path")
        except ValueError as exc:
            raise RehearsalError(str(exc)) from exc
        # Named now (the tiny model's path goes into the manifests), created only once the input is admitted.
        output_dir = (args.output_dir or Path(tempfile.gettempdir()) / f"rehearsal-{secrets.token_hex(4)}").resolve()
        progress = Progress(echo=not args.quiet)
        small_model = output_dir / "scale-small" / "model" if args.scale == "small" else None
        admission = admit(
            manifests.objects,
            manifests.sources,
            skip_unsupported=args.skip_unsupported,
            command_paths=command_paths,
            substitutes=substitutes,
            small_model=small_model,
        )
        admission.notes[:0] = [f"named {g} (as the API server would)" for g in manifests.generated]
        host_paths = [p.resolve() for p in args.host_path] + [Path(p) for p in substitutes.values()]
        if small_model is not None:
            # torch and transformers load only for --scale small (seconds; the rest of trainctl stays quick).
            from rehearse.tiny_model import corpus_lines, save_tiny_model

            save_tiny_model(small_model, corpus_lines())
            host_paths.append(small_model)
        options = Options(
            output_dir=output_dir,
            timeout_s=args.timeout,
            kills=tuple(Kill.parse(k) for k in args.kill),
            backoff_base_s=args.pod_backoff,
            host_paths=tuple(host_paths),
            log=progress.log,
            image_python=image_pythons(args.image_python, ImageLock.load()),
            ranks_per_pod=args.ranks_per_pod,
        )
        if not any(o["kind"] in ("Job", "RayJob", "RayCluster") for o in admission.objects):
            _report(admission)
            print("nothing ran: every workload was skipped", file=sys.stderr)
            return ExitCode.NO_EVIDENCE
        if args.env is not None:
            from rehearse.cluster.session import parse_node_kill, run_on_environment

            rehearsal = run_on_environment(
                admission.objects,
                options,
                environment=args.env,
                gpu_nodes=dict(args.nodes),
                quota_nodes=dict(args.quota),
                time_scale=args.time_scale,
                node_kills=tuple(parse_node_kill(k) for k in args.kill_node),
            )
        elif args.nodes or args.quota or args.kill_node or args.time_scale != 1.0:
            raise RehearsalError("--nodes, --quota, --kill-node and --time-scale need --env (the cluster they act on)")
        else:
            rehearsal = run(admission.objects, options)
    except KeyboardInterrupt:
        # run() stops every pod on the way out (its `finally`); what ran is what its log said.
        interrupted(progress, args.json)
        return ExitCode.INTERRUPTED
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except InputError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"error: {len(exc.problems)} problem(s); nothing was run", file=sys.stderr)
        return ExitCode.ERROR
    except RehearsalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    code = ExitCode.OK if rehearsal.exit_code == 0 else ExitCode.CHECK_FAILED
    if code == ExitCode.OK and admission.skipped:
        code = ExitCode.NO_EVIDENCE
    if args.json:
        document = rehearsal.to_json()
        document["skipped"] = [{"kind": s.kind, "name": s.name, "reason": s.reason} for s in admission.skipped]
        document["notes"] = [*admission.notes, *rehearsal.notes]
        document["exit_code"] = int(code)
        print(json.dumps(document, indent=2))
    else:
        _report(admission)
        print(format_table(rehearsal))
    return code
