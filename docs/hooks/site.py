"""MkDocs hooks: the README is the site's home page and the notebooks are pages, both read from
where they live in the repository (nothing is copied into docs/)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
#: The line of docs/index.md that the README replaces.
MARKER = "<!-- README -->"
#: Files of the repository that the README shows and the site serves too.
EXTRA = ["data/demo.png"]


@event_priority(100)  # before mkdocs-jupyter, which turns the notebooks into pages
def on_files(files: Files, config) -> Files:
    paths = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    for path in [*paths, *EXTRA]:
        if (ROOT / path).exists():
            files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def site_link(match: re.Match[str]) -> str:
    """A README link as the site's: docs/ pages and notebooks are pages here; any other file of
    the repository (examples/, benchmarks/) is named, not linked."""
    text, target = match.group(1), match.group(2)
    if re.match(r"[a-z]+:|#", target):
        return match.group(0)
    path, _, anchor = target.partition("#")
    if path.startswith("docs/"):
        path = path.removeprefix("docs/")
    elif path.startswith("notebooks/") and path.endswith(".py"):
        path = path.removesuffix(".py") + ".ipynb"
    elif not any(path == p for p in EXTRA):
        return f"`{path}` in the repository" if text.strip("`") == path else \
            f"{text} (`{path}` in the repository)"
    return f"[{text}]({path}{'#' + anchor if anchor else ''})"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "index.md" or MARKER not in markdown:
        return markdown
    readme = (ROOT / "README.md").read_text()
    readme = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", site_link, readme)
    return markdown.replace(MARKER, readme)
