r"""Wheels for running `benchmarks/gpu_check.py` on the GPU machine image, which has no package registry.

The image (Python 3.12.3, torch 2.11.0, triton 3.6.0; IMAGE_PACKAGES below) has most of what
genome_lm imports, but not pydantic or fla, and its transformers is older than genome_lm's. This
script downloads what it lacks, at the versions pinned in requirements.lock (each wheel checked
against the lock's hashes), as CPython 3.12 manylinux x86_64 wheels into .whl/ (git-ignored):

    python tools/gpu_kit.py                        # `make gpu-kit`: requirements.lock -> .whl/
    python tools/gpu_kit.py --lock PATH --dest DIR

and on the GPU machine, from the repository root:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:. python3 benchmarks/gpu_check.py

What is carried is listed by hand, each package with its reason: CARRY always, CARRY_WHEN_NEEDED
only when a carried wheel needs it (the set that a transformers needing huggingface-hub 2 brings).
A package is needed when a carried wheel's Requires-Dist (markers for CPython 3.12 on Linux x86_64,
extras skipped) is not met by another carried wheel or provably by the image (IMAGE_VERSIONS), or
when a carried wheel breaks a requirement of an image package (IMAGE_REQUIRES). A requirement that is
neither met nor listed for carrying is printed as a WARNING: add the package to one of the lists.

.whl/ then holds exactly the carried wheels, one version each (other wheels are removed); a rerun
with all of them present downloads nothing. Prints each wheel with its size and the total; exits 1
with one line when a download fails or the total reaches 60 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # pip always brings its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60

# Carried always. gpu_check imports genome_lm.config, .model, .parallel, .train.parallelize,
# .eval.scoring and .tf32; at module level these import torch, numpy, pyarrow, pyyaml, tqdm,
# safetensors, huggingface_hub (all on the image), transformers and pydantic. datasets, pyfaidx,
# ray, wandb and megatron are imported only inside functions that the check does not call.
CARRY = {
    "transformers": "genome_lm.model imports it (glm5_next); the image's 5.17.0 is older than pyproject allows",
    "fla-core": "fla's Triton kernels (fla.ops.kda, fla.modules): the kda check and KDA layers on CUDA",
    "flash-linear-attention": "fla's layers and models over fla-core, at the gpu extra's pinned version",
    "pydantic": "genome_lm.config and genome_lm.options import it; not on the image",
    "pydantic-core": "pydantic pins it and genome_lm.options imports it; not on the image",
    "annotated-types": "pydantic requires it; not on the image",
    "typing-inspection": "pydantic requires it; not on the image",
    "typing-extensions": "pydantic and pydantic-core require >= 4.16; the image's version is unknown",
}

# Carried when needed (see the module docstring); a transformers needing huggingface-hub 2 brings these.
CARRY_WHEN_NEEDED = {
    "huggingface-hub": "transformers >= 5.25 requires >= 2.4 and checks it at import; the image has 1.33.0",
    "tokenizers": "the image's 0.23.2 requires huggingface-hub < 2",
    "kernels": "transformers >= 5.25 requires it; not on the image",
    "tomlkit": "kernels requires it; not on the image",
    "httpx2": "huggingface-hub 2 requires it; not on the image",
    "httpcore2": "httpx2 pins it; not on the image",
    "truststore": "httpx2 and httpcore2 require it; not on the image",
    "anyio": "httpx2 requires >= 4.10; the image's version is unknown",
    "idna": "httpx2 requires >= 3.18; the image's version is unknown",
    "h11": "httpcore2 requires >= 0.16; the image's version is unknown",
    "pyyaml": "kernels requires >= 6; the image's version is known only to be >= 5.1",
}

# The Python packages of the GPU image ('cuda'), as read there.
IMAGE_PACKAGES = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())

# What is known of image versions: "==V" read on the image (its pip list), else
# bounds (">=" and "<" only) that the image's own packages require of it. Absent: unknown.
IMAGE_VERSIONS = {
    "accelerate": "==1.15.0",
    "huggingface-hub": "==1.33.0",
    "numpy": "==2.5.2",
    "safetensors": "==0.8.0",
    "tokenizers": "==0.23.2",
    "torch": "==2.11.0",
    "torchaudio": "==2.11.0",
    "torchvision": "==0.26.0",
    "transformers": "==5.17.0",
    "triton": "==3.6.0",
    # required by the image's transformers 5.17.0
    "pyyaml": ">=5.1",
    "regex": ">=2025.10.22",
    "tqdm": ">=4.60",
    # required by the image's huggingface-hub 1.33.0
    "click": ">=8.4.2,<9.0.0",
    "filelock": ">=3.10.0",
    "fsspec": ">=2023.5.0",
    "hf-xet": ">=1.6.0,<2.0.0",
    "httpx": ">=0.23.0,<1",
    "packaging": ">=20.9",
    "typing-extensions": ">=4.1.0",
}

# Requirements of image packages (their wheels' Requires-Dist at the image's version) that a
# carried wheel can break; the image package is then carried at the locked version.
IMAGE_REQUIRES = {
    "tokenizers": ["huggingface-hub>=0.16.4,<2.0"],
}

# The image: CPython 3.12.3 on Linux x86_64.
MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
    "extra": "",
}

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
MORE_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1) if f"manylinux_2_{n}_x86_64" not in PLATFORMS]
PIP_DOWNLOAD = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                "3.12", "--implementation", "cp", "--disable-pip-version-check", "-q"]


class KitError(Exception):
    """One line for the user; the script exits 1 with it."""


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Pin:
    name: str
    version: str
    hashes: set[str] = field(default_factory=set)


def read_lock(path: Path) -> dict[str, Pin]:
    """The `name==version` pins of a pip requirements file, with their `--hash=sha256:` values."""
    if not path.is_file():
        raise KitError(f"{path} not found (make lock writes it; or pass --lock PATH)")
    pins: dict[str, Pin] = {}
    current = None
    for line in path.read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line):
            current = pins[canon(m[1])] = Pin(canon(m[1]), m[2])
        elif not line[:1].isspace() and not line.startswith("#"):
            current = None
        if current is not None:
            current.hashes.update(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    if not pins:
        raise KitError(f"{path}: no `name==version` pins in it")
    return pins


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except ValueError:  # InvalidVersion
        return a == b


@dataclass
class Wheel:
    path: Path
    name: str
    version: str

    @classmethod
    def parse(cls, path: Path) -> Wheel | None:
        parts = path.name[: -len(".whl")].split("-")
        return cls(path, canon(parts[0]), parts[1]) if path.suffix == ".whl" and len(parts) >= 5 else None

    def requires(self) -> list[Requirement]:
        """Its Requires-Dist that apply on the image (markers evaluated, extras skipped)."""
        with zipfile.ZipFile(self.path) as zf:
            meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            headers = HeaderParser().parsestr(zf.read(meta).decode())
        reqs = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
        return [r for r in reqs if r.marker is None or r.marker.evaluate(MARKER_ENV)]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def installable(path: Path) -> bool:
    """Whether a wheel's tags fit CPython 3.12 on manylinux x86_64."""
    py, abi, plat = path.name[: -len(".whl")].split("-")[-3:]
    py_ok = any(t in ("py3", "cp312") or (abi == "abi3" and re.fullmatch(r"cp3\d+", t) and int(t[3:]) <= 12)
                for t in py.split("."))
    abi_ok = any(a in ("none", "abi3", "cp312") for a in abi.split("."))
    plat_ok = any(p == "any" or (p.startswith("manylinux") and p.endswith("_x86_64")) for p in plat.split("."))
    return bool(py_ok and abi_ok and plat_ok)


def fetch(pin: Pin, dest: Path) -> Wheel:
    """The wheel of `pin` in dest: the one there when its version, tags and hash fit, else downloaded."""
    for path in sorted(dest.glob("*.whl")):
        wheel = Wheel.parse(path)
        if wheel and wheel.name == pin.name and same_version(wheel.version, pin.version):
            if installable(path) and zipfile.is_zipfile(path) and (not pin.hashes or sha256(path) in pin.hashes):
                print(f"  have   {pin.name}=={pin.version}")
                return wheel
            print(f"  remove {path.name} (tags or hash do not fit)")
            path.unlink()
    print(f"  fetch  {pin.name}=={pin.version}", flush=True)
    line = f"{pin.name}=={pin.version}" + "".join(f" --hash=sha256:{h}" for h in sorted(pin.hashes))
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text(line + "\n")
        for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
            cmd = PIP_DOWNLOAD + [f"--platform={p}" for p in platforms] + ["-d", str(dest), "-r", str(reqs)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0 or "matching distribution" not in done.stderr:
                break
    if done.returncode != 0:
        errors = [ln.strip() for ln in done.stderr.splitlines() if ln.startswith("ERROR")] or ["(no message)"]
        if "DO NOT MATCH THE HASHES" in done.stderr:
            errors.append("the downloaded wheel does not match the lock's hashes")
        raise KitError(f"download of {pin.name}=={pin.version} failed: {errors[-1]}")
    for path in dest.glob("*.whl"):
        wheel = Wheel.parse(path)
        if wheel and wheel.name == pin.name and same_version(wheel.version, pin.version):
            return wheel
    raise KitError(f"pip downloaded no wheel of {pin.name}=={pin.version} into {dest}")


def image_meets(name: str, spec: SpecifierSet) -> bool:
    """Whether the image's `name` provably satisfies `spec` (IMAGE_VERSIONS)."""
    if name not in IMAGE_PACKAGES:
        return False
    if not spec:
        return True
    known = SpecifierSet(IMAGE_VERSIONS.get(name, ""))
    if len(known) == 1 and next(iter(known)).operator == "==":
        return spec.contains(next(iter(known)).version, prereleases=True)
    low = max((Version(s.version) for s in known if s.operator == ">="), default=None)
    high = min((Version(s.version) for s in known if s.operator == "<"), default=None)
    for s in spec:
        v = Version(s.version)
        ok = {">=": low is not None and low >= v, ">": low is not None and low > v,
              "<": high is not None and high <= v, "<=": high is not None and high <= v,
              "!=": (low is not None and low > v) or (high is not None and high <= v)}.get(s.operator, False)
        if not ok:
            return False
    return True


def unmet(kit: dict[str, Wheel]) -> list[tuple[str, str]]:
    """(package to carry, why) for each requirement that the kit and the image together leave unmet."""
    found = []
    for wheel in kit.values():
        for req in wheel.requires():
            name, needs = canon(req.name), f"{wheel.name} {wheel.version} requires {req.name}{req.specifier}"
            if name in kit:
                if not req.specifier.contains(kit[name].version, prereleases=True):
                    found.append((name, f"{needs}; the lock has {kit[name].version}"))
            elif not image_meets(name, req.specifier):
                have = IMAGE_VERSIONS.get(name, "unknown version") if name in IMAGE_PACKAGES else "not there"
                found.append((name, f"{needs}; on the image: {have}"))
    for name, reqs in IMAGE_REQUIRES.items():
        for req in map(Requirement, reqs):
            other = kit.get(canon(req.name))
            if name not in kit and other and not req.specifier.contains(other.version, prereleases=True):
                found.append((name, f"the image's {name} requires {req}, the kit has {other.name} {other.version}"))
    return found


def build(lock: Path, dest: Path) -> list[Path]:
    pins = read_lock(lock)
    dest.mkdir(parents=True, exist_ok=True)
    print(f"gpu-kit: {lock} -> {dest}")
    wanted = dict(CARRY)
    kit: dict[str, Wheel] = {}
    while True:
        for name in wanted:
            if name not in kit:
                if name not in pins:
                    raise KitError(f"{name} is carried but {lock} has no pin for it")
                kit[name] = fetch(pins[name], dest)
        problems = unmet(kit)
        more = {name for name, _ in problems if name in CARRY_WHEN_NEEDED and name not in wanted}
        if not more:
            break
        for name, why in problems:
            if name in more:
                print(f"  needed {name}: {why}")
        wanted.update((name, CARRY_WHEN_NEEDED[name]) for name in sorted(more))
    for name, why in problems:
        fix = "" if name in kit else f": add {name} to CARRY or CARRY_WHEN_NEEDED in {Path(__file__).name}"
        print(f"WARNING: {why}{fix}")
    keep = {wheel.path.name for wheel in kit.values()}
    for path in sorted(dest.glob("*.whl")):
        if path.name not in keep:
            print(f"  remove {path.name} (not in the kit)")
            path.unlink()
    return sorted(wheel.path for wheel in kit.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements.lock", help="pinned versions and hashes")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="folder of the wheels")
    args = parser.parse_args(argv)
    try:
        wheels = build(args.lock, args.dest)
    except KitError as exc:
        print(f"gpu-kit: error: {exc}", file=sys.stderr)
        return 1
    width = max(len(p.name) for p in wheels) + 2
    mib = {p: p.stat().st_size / 2**20 for p in wheels}
    print(f"\n{'wheel':<{width}}{'MiB':>8}")
    for path in wheels:
        print(f"{path.name:<{width}}{mib[path]:>8.2f}")
    total = sum(mib.values())
    print(f"{f'total ({len(wheels)} wheels)':<{width}}{total:>8.2f}")
    if total >= LIMIT_MIB:
        print(f"gpu-kit: error: the wheels total {total:.1f} MiB; the limit is under {LIMIT_MIB} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
