"""A griffe extension for the API reference: the package's docstrings as mkdocstrings reads them.

The docstrings are Google style with Sphinx roles, as the package's readers in an editor or in
``help()`` see them. Three things change on the site, nothing in the package:

* A role (``:class:`~cubicml_lab.search.Proposal```, ``:meth:`ask```) becomes a cross-reference.
  One that names an object of the package (absolutely, or from the docstring's scope) links to its
  page, or stays code where the object is an implementation detail that no page shows (a private
  submodule, an undocumented constant). One that names nothing of the package is a hard link that
  fails the strict build: a typo or a renamed object. Another library's object (torch, pandas, the
  standard library) stays code: the site reads no other site's inventory.
* ``Example:`` is the ``Examples:`` section (doctests rendered as code, not as Markdown).
* ``a, b: text`` in an ``Args:`` section documents ``a`` and ``b`` (griffe wants one name a line).
"""

from __future__ import annotations

import builtins
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
ARGS = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|"
                  r"Other Parameters|Attributes):\s*$")
MANY = re.compile(r"^(\s+)(\w+(?:,\s*\w+)+)(\s*\([^)]*\))?:(.*)$")

#: First parts of the names that belong to other libraries: shown as code, not linked.
EXTERNAL = {"torch", "np", "numpy", "pd", "pandas", "botorch", "gpytorch", "scipy", "matplotlib",
            "plt", "ipywidgets", "IPython", "submitit", "transformers", "lightning", "accelerate",
            "yaml", "json", "sqlite3", "os", "sys", "subprocess", "signal", "threading",
            "concurrent", "multiprocessing", "pathlib", "typing", "collections", "dataclasses",
            "datetime", "time", "logging", "warnings", "importlib", "tempfile", "shutil",
            "contextlib", "functools", "itertools", "math", "random", "re", "io", "tqdm",
            "pyarrow", "jupyter_server", "nbformat", "nbclient"} | set(dir(builtins))


def find(scope: griffe.Object, dotted: str) -> griffe.Object | None:
    """The object ``dotted`` names from ``scope`` (or absolutely), or None."""
    top = dotted.split(".")[0]
    chain = [scope.modules_collection[top]] if top in scope.modules_collection else []
    obj: Any = scope
    while obj is not None:
        chain.append(obj)
        obj = obj.parent
    for start in chain:
        first, *rest = dotted.split(".")
        if start.path == first:
            found: Any = start
        else:
            found = start.all_members.get(first) if hasattr(start, "all_members") else None
        try:
            for part in rest:
                found = found.all_members[part] if found is not None else None
            if found is not None:
                return found.final_target if found.is_alias else found
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError, AttributeError):
            continue
    return None


def roles(scope: griffe.Object, text: str) -> str:
    """Every role of ``text`` as a cross-reference (or code)."""
    def link(match: re.Match[str]) -> str:
        short, body = match.group(1), match.group(2).strip()
        title, _, target = body.partition("<")
        target = (target.rstrip(">") if target else title).strip().removesuffix("()")
        shown = title.strip() if body.endswith(">") else (
            target.rsplit(".", 1)[-1] if short else target)
        if target.split(".", 1)[0] in EXTERNAL:
            return f"`{shown}`"
        found = find(scope, target)
        if found is None:
            return f"[`{shown}`][{target}]"  # names nothing: the strict build says where
        return f'<autoref identifier="{found.path}" optional><code>{shown}</code></autoref>'
    return ROLE.sub(link, text)


def sections(text: str) -> str:
    """``Example:`` as ``Examples:``; ``a, b: text`` in an Args section as one entry each."""
    out: list[str] = []
    lines = text.splitlines()
    in_args: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        header = ARGS.match(line)
        if header:
            in_args = header.group(1)
        elif line.strip() and in_args is not None and \
                len(line) - len(line.lstrip()) <= len(in_args):
            in_args = None
        many = MANY.match(line) if in_args is not None else None
        if many:
            indent = len(many.group(1))
            body = [line]
            while i + 1 < len(lines) and (not lines[i + 1].strip() or
                                          len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                i += 1
                body.append(lines[i])
            for name in re.split(r",\s*", many.group(2)):
                out.append(f"{many.group(1)}{name}{many.group(3) or ''}:{many.group(4)}")
                out.extend(body[1:])
        else:
            out.append(re.sub(r"^(\s*)Example:\s*$", r"\1Examples:", line))
        i += 1
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the package once the whole package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = roles(obj, sections(obj.docstring.value))
            stack.extend(m for m in obj.members.values() if not m.is_alias)
