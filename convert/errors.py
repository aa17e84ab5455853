"""Errors of converting and loading: one-line messages meant for the user."""


class ConvertError(Exception):
    """A checkpoint that cannot be converted or loaded; the message is one line."""

    def __init__(self, msg: str):
        super().__init__(" ".join(str(msg).split()))


class Cancelled(Exception):
    """Raised inside the writer thread when the conversion was interrupted."""


def name_list(names, limit: int = 8) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
