"""The image environments in tests: with IMAGE_ENVS=1 (`make test-image`), the rehearsals' pods and the NVRx runs
use the virtualenv built for each image (scripts/image_envs.py: its Python and the lock's package versions) instead
of this process's environment; an environment that is not built fails the test naming `make image-envs`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from k8s.images import ImageLock

ROOT = Path(__file__).resolve().parent.parent
ENABLE = "IMAGE_ENVS"


def enabled() -> bool:
    return os.environ.get(ENABLE) == "1"


def module() -> ModuleType:
    loaded = sys.modules.get("image_envs")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("image_envs", ROOT / "scripts" / "image_envs.py")
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules["image_envs"] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def interpreter(image: str) -> Path:
    """The built environment's python for a lock image name (ImageEnvError, naming the fix, if not built)."""
    path: Path = module().built_interpreter(image)
    return path


def image_pythons(lock: ImageLock) -> dict[str, Path]:
    """Options.image_python for the rehearsals: every image with runtime facts, when IMAGE_ENVS=1; else none."""
    if not enabled():
        return {}
    return {lock.get(env.image).reference: interpreter(env.image) for env in module().image_envs(lock)}


def tool(image: str, name: str, default: str) -> str:
    """A console script (ft_launcher, ray) of image's environment when IMAGE_ENVS=1, else `default`."""
    return str(interpreter(image).with_name(name)) if enabled() else default
