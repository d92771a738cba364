"""What ``make lab`` adds to the JupyterLab server: :func:`refresh_git_index`, a post-save hook.

``make lab`` installs nbstripout as git's clean filter for notebooks, so a notebook saved with
its outputs has the same content to git as the stripped one committed. But git takes a file
whose size changed for a changed file without running the filter (``git status`` lists it while
``git diff`` shows nothing), and outputs change the size. After each save of a tracked notebook
this hook asks git, through the filter, whether its content changed; where it did not, it
re-records the file in git's index (its stat data; the content git holds stays as it was), so
``git status`` stays clean until a cell is edited. ``make lab`` passes it to the server
(``--FileContentsManager.post_save_hook=cubicml_lab.lab.refresh_git_index``). Importing this
module imports nothing heavy.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

__all__ = ["refresh_git_index"]

_GIT_TIMEOUT_S = 60.0  # the clean filter starts a Python interpreter per notebook


def _git(folder: str, *args: str) -> int:
    """Exit status of ``git args`` run in ``folder`` (127: git missing or it timed out)."""
    try:
        return subprocess.run(["git", *args], cwd=folder, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=_GIT_TIMEOUT_S).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 127


def refresh_git_index(os_path: str, model: Any = None, contents_manager: Any = None,
                      **_: Any) -> bool:
    """After JupyterLab saved ``os_path``: where it is a notebook git tracks whose content,
    through git's filters, equals what git's index holds, re-record it in the index (``git add``
    of unchanged content), so that ``git status`` does not list it. Never raises.

    Args:
        os_path: The file just written.
        model, contents_manager: What the server passes to a post-save hook (unused).

    Returns:
        Whether the index entry was refreshed.
    """
    if not str(os_path).endswith(".ipynb"):
        return False
    folder, name = os.path.split(os.path.abspath(os_path))
    if _git(folder, "ls-files", "--error-unmatch", "--", name) != 0:
        return False  # not in a git checkout, or not tracked
    if _git(folder, "diff", "--quiet", "--no-ext-diff", "--no-textconv", "--", name) != 0:
        return False  # a cell was edited (or git failed): leave it for the person to see
    return _git(folder, "add", "--", name) == 0
