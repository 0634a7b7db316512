"""Per-volume tokens: what E2B's ``Volume.create`` / ``connect`` hand out for the content API.

A token is ``<holder>.<HMAC>`` under the sandbox-token key
(``sandbox_tokens.py``), its message marked as a volume's, so no sandbox
token or preview link passes for one, nor the reverse. It opens one
volume's files (``/volumecontent/{id}/...``) and nothing else: no other
volume, no API call, no sandbox. The holder is the id of the API token it
was handed to: the caller acts as that token's tenant with none of its
rights, and once that token is gone from the tokens file, so is the volume
token.
"""

from __future__ import annotations

from .sandbox_tokens import SandboxTokens


class VolumeTokens:
    """Issues and checks the tokens of volumes."""

    def __init__(self, tokens: SandboxTokens) -> None:
        self.tokens = tokens

    def issue(self, volume_id: str, holder: str) -> str:
        """The token for ``holder`` (an API token's id) to reach ``volume_id``'s files."""
        return self.tokens.issue(_subject(volume_id), holder)

    def holder(self, volume_id: str, token: str | None) -> str | None:
        """Whose token ``token`` is, if it was issued for ``volume_id``; else None."""
        return self.tokens.holder(_subject(volume_id), token)


def _subject(volume_id: str) -> str:
    return f"volume\0{volume_id}"
