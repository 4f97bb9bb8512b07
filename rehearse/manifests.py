"""Reading manifests as `kubectl apply -f` reads them: files and directories (`-R` recursive), several
YAML or JSON documents per file, `kind: List` (and any `*List` with `items`) flattened to its objects, and
`metadata.generateName` given a name as the API server gives it.

kubectl: staging/src/k8s.io/cli-runtime/pkg/resource/visitor.go (FileVisitorForSTDIN, ExpandPathsToFileVisitors:
a directory's files ending in .json, .yaml or .yml, subdirectories only with --recursive) and
pkg/api/meta (IsListType, ExtractList). API server: staging/src/k8s.io/apiserver/pkg/storage/names/generate.go
(SimpleNameGenerator: the prefix cut to 58 characters, then 5 characters of utilrand.String from
k8s.io/apimachinery/pkg/util/rand: "bcdfghjklmnpqrstvwxz2456789").
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")
# libyaml's safe loader where PyYAML was built with it: the same documents, ~50x faster on the 600 KB code files.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
GENERATED_SUFFIX_LENGTH = 5
MAX_NAME_LENGTH = 63


class ManifestError(Exception):
    """A file or document kubectl would not read (exit 2): names the file and what is wrong."""


@dataclass
class Manifests:
    objects: list[dict[str, Any]] = field(default_factory=list)
    # Where each object came from ("file" or "file: item 3 of List"), parallel to `objects`.
    sources: list[str] = field(default_factory=list)
    # "Job/train-x7k2q from generateName train-" for every name the rehearsal generated.
    generated: list[str] = field(default_factory=list)


def generate_name(prefix: str) -> str:
    """What the API server names an object with `metadata.generateName: prefix`."""
    base = prefix[: MAX_NAME_LENGTH - GENERATED_SUFFIX_LENGTH]
    return base + "".join(secrets.choice(NAME_ALPHABET) for _ in range(GENERATED_SUFFIX_LENGTH))


def manifest_files(paths: Iterable[Path], recursive: bool = False) -> list[Path]:
    """The files `kubectl apply -f PATH...` reads, in its order (a directory's files sorted by name)."""
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            found = path.rglob("*") if recursive else path.iterdir()
            matching = sorted(p for p in found if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
            if not matching:
                hint = "" if recursive else " (subdirectories are read with -R/--recursive)"
                raise ManifestError(f"{path}: no .json, .yaml or .yml files in the directory{hint}")
            files += matching
        elif path.exists():
            files.append(path)
        else:
            raise ManifestError(f"{path}: no such file or directory")
    return files


def _is_list(doc: dict[str, Any]) -> bool:
    return str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list)


def _check_object(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: a document is not a Kubernetes object (a mapping with apiVersion and kind)")
    missing = [key for key in ("apiVersion", "kind") if not doc.get(key)]
    if missing:
        raise ManifestError(f"{where}: the object has no {' or '.join(missing)} (kubectl: 'Object ... is invalid')")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not (meta.get("name") or meta.get("generateName")):
        raise ManifestError(
            f"{where}: {doc['kind']} has no metadata.name (API server: 'name or generateName is required'); "
            "add metadata.name or metadata.generateName"
        )
    return doc


def yaml_documents(text: str) -> list[Any]:
    """Every YAML (or JSON) document of `text`, empty ones as None; yaml.YAMLError where it is not YAML."""
    return list(yaml.load_all(text, Loader=_SAFE_LOADER))


def load(paths: Iterable[Path], recursive: bool = False) -> Manifests:
    """Every object of the files, Lists flattened and generated names given; ManifestError naming the file."""
    out = Manifests()
    for path in manifest_files(paths, recursive):
        try:
            docs = yaml_documents(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ManifestError(f"{path}: cannot read Kubernetes YAML or JSON: {exc}") from exc
        for number, doc in enumerate(docs, start=1):
            if doc is None:
                continue
            where = f"{path}" if len(docs) == 1 else f"{path}: document {number}"
            if isinstance(doc, dict) and _is_list(doc):
                items = [(item, f"{where}: item {i} of {doc['kind']}") for i, item in enumerate(doc["items"])]
            else:
                items = [(doc, where)]
            for item, item_where in items:
                obj = _check_object(item, item_where)
                meta = obj["metadata"]
                if not meta.get("name"):
                    meta["name"] = generate_name(str(meta["generateName"]))
                    out.generated.append(f"{obj['kind']}/{meta['name']} from generateName {meta['generateName']}")
                out.objects.append(obj)
                out.sources.append(item_where)
    return out


def load_manifests(paths: Iterable[Path], recursive: bool = False) -> list[dict[str, Any]]:
    """Every object of the files (see `load`)."""
    return load(paths, recursive).objects
