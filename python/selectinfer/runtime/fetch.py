"""Downloads from the package registries (PyPI through pip, Debian through apt), nothing else."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


class FetchError(RuntimeError):
    """A registry package could not be fetched; the message names the package and the fix."""


def pip_download(package: str, version: str, dest: Path, *, sdist: bool = False, quiet: bool = True) -> Path:
    """Downloads one distribution of package==version (a wheel, or the sdist) into dest, without
    its dependencies, and returns its path."""
    fmt = ["--no-binary", package] if sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *fmt, f"{package}=={version}", "-d", str(dest)]
    if quiet:
        cmd.append("-q")
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr, stderr=subprocess.PIPE, text=True)
    pattern = "*.tar.gz" if sdist else "*.whl"
    found = sorted(dest.glob(pattern))
    if proc.returncode != 0 or not found:
        last = [line for line in (proc.stderr or "").strip().splitlines() if not line.startswith("WARNING")]
        raise FetchError(f"could not download {package}=={version} from PyPI{': ' + last[-1] if last else ''}; "
                         "check network access to the package index")
    return found[0]


def apt_download(package: str, dest: Path) -> Path:
    """Downloads a Debian package (.deb) into dest with `apt-get download` and returns its path."""
    if not shutil.which("apt-get"):
        raise FetchError(f"the Debian package {package} is needed but apt-get is not available on this machine; "
                         "use your own data file instead (--data FILE:TASK)")
    for attempt in range(2):
        proc = subprocess.run(["apt-get", "download", "-q", package], cwd=dest, capture_output=True, text=True)
        found = sorted(dest.glob(f"{package}_*.deb"))
        if proc.returncode == 0 and found:
            return found[0]
        if attempt == 0:  # a fresh machine may not have package lists yet
            subprocess.run(["apt-get", "update", "-q"], capture_output=True)
    last = (proc.stderr or "").strip().splitlines()
    raise FetchError(f"could not download the Debian package {package}{': ' + last[-1] if last else ''}; "
                     "check access to the Debian archive or run `apt-get update`")


def deb_extract(deb: Path, dest: Path) -> Path:
    """Unpacks a .deb's files under dest (no installation) and returns dest."""
    proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"could not unpack {deb.name}: {proc.stderr.strip()}")
    return dest
