"""The one exception a lab user sees: ``drl-lab`` prints it as ``error: <message>``."""


class LabError(Exception):
    """A problem the user can fix (bad experiment file, missing tool, not root), in one line."""
