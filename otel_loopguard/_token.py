"""The bearer token shared by ``serve`` and the hooks' ``--server`` client, read one way.

From ``--token``, else the file ``--token-file`` names, else ``LOOPGUARD_SERVE_TOKEN``. An empty
token is an error wherever it comes from: on the server it would turn authentication off, on a
client it would send requests without one. Each caller says what to do about it in its own words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from ._env import LOOPGUARD_SERVE_TOKEN

__all__ = ["EmptyToken", "read_token"]

#: Where a token given on the command line comes from, as an error message names it.
TOKEN_OPTION: Final = "--token"


class EmptyToken(ValueError):
    """The token found is empty (or white space); ``where`` names its source."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where}: the token is empty")
        self.where = where


def read_token(
    token: str | None,
    token_file: str | None,
    environ: Mapping[str, str] | None = None,
    variable: str = LOOPGUARD_SERVE_TOKEN,
) -> tuple[str, str] | None:
    """``(token, where it came from)``: ``token`` (``--token``), else the contents of
    ``token_file`` (``--token-file``; a leading ``~`` expanded, surrounding white space dropped),
    else ``variable`` in ``environ`` (default: ``os.environ``); ``None`` when none is set.

    Raises :class:`EmptyToken` for an empty token, and ``ValueError`` naming the file when it
    cannot be read.
    """
    if token is not None:
        found, where = token, TOKEN_OPTION
    elif token_file is not None:
        try:
            with open(os.path.expanduser(token_file), encoding="utf-8") as file:
                found = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--token-file: cannot read {token_file!r}: {exc}") from None
        where = f"--token-file {token_file!r}"
    else:
        env = os.environ if environ is None else environ
        if variable not in env:
            return None
        found, where = env[variable], variable
    if not found.strip():
        raise EmptyToken(where)
    return found, where
