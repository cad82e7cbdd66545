"""Directories of ours that other users must not write to (the index cache, the disk cache):
an entry planted by someone else could make records read wrong, so such a directory is
refused when it is opened."""

from __future__ import annotations

import os
import stat


def open_private_dir(directory: str, option: str, planted: str) -> int:
    """A descriptor of `directory`, after checking that only this user can write there.

    `option` names the setting in the error (`cache_dir`), `planted` what another user could
    plant there ("segments", "index entries")."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others"))
                           if st.st_mode & bit)
        problem = (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); run "
                   f"`chmod go-w {directory}`")
    if problem:
        os.close(fd)
        raise PermissionError(
            f"{option} {directory} {problem}: another user could plant {planted} that make "
            f"records read wrong. Use a directory only you can write to (or pass no {option}).")
    return fd
