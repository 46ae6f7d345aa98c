"""MkDocs hook: search that works with the site opened from its folder (file://, no server).

Material's search runs in a Web Worker, which a browser will not start from a file:// page.
Its offline plugin (mkdocs.yml) inlines the search index and loads the iframe-worker shim (npm
``iframe-worker``, MIT, by Material's author: a Worker run in an iframe) from
https://unpkg.com, unless ``extra.polyfills`` already names one. A site meant to be read offline
should load nothing from elsewhere, and unpkg.com is not reachable from every machine that
builds it; so the shim comes from the npm registry through npm's own client (``npm pack``),
pinned, once into build/npm/, and is published with the site as
``assets/javascripts/iframe-worker-shim.js`` (its license beside it), which mkdocs.yml's
``extra.polyfills`` names.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PACKAGE, VERSION = "iframe-worker", "1.0.4"
CACHE = Path(__file__).resolve().parents[2] / "build" / "npm" / f"{PACKAGE}-{VERSION}"
PUBLISHED = {  # in the package -> on the site
    "package/shim/index.js": "assets/javascripts/iframe-worker-shim.js",
    "package/LICENSE": "assets/javascripts/iframe-worker-LICENSE.txt",
}


def on_files(files: Files, config: Any) -> Files:
    """Add the shim and its license to the site's files."""
    for inside, published in PUBLISHED.items():
        source = _unpacked(inside)
        files.append(File.generated(config, published, abs_src_path=str(source)))
    return files


def _unpacked(inside: str) -> Path:
    """The file ``inside`` the package, unpacked into the cache (``npm pack`` on first use)."""
    target = CACHE / inside
    if target.is_file():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise PluginError(
            f"search from the site's folder needs the {PACKAGE} shim from npm, and npm is not "
            "installed (apt-get install npm; nox -s docs does)"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(CACHE)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    tarball = CACHE / f"{PACKAGE}-{VERSION}.tgz"
    if done.returncode != 0 or not tarball.is_file():
        raise PluginError(f"npm pack {PACKAGE}@{VERSION} failed: {done.stderr.strip()[-500:]}")
    with tarfile.open(tarball) as archive:
        for member in PUBLISHED:
            data = archive.extractfile(member)
            if data is None:
                raise PluginError(f"{tarball} has no {member}")
            unpacked = CACHE / member
            unpacked.parent.mkdir(parents=True, exist_ok=True)
            unpacked.write_bytes(data.read())
    return target
