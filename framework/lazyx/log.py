"""What lazyx tells the user while it works: the ``lazyx`` logger, and warnings that
point at the user's line.

**The logger.** Everything lazyx logs goes through the standard :mod:`logging`
module, to the logger named ``lazyx`` (a :class:`logging.NullHandler` is attached,
as libraries do, so lazyx never configures the application's logging). The flow:

1. ``import lazyx`` reads ``LAZYX_LOG`` (only then is this module imported at import
   time). Set to ``debug``, ``info`` or ``warning``, it attaches one stderr handler
   at that level to the ``lazyx`` logger (:func:`configure`, once per process); any
   other value is a ``RuntimeWarning`` naming the accepted ones.
2. Work the user waits for, more than about a second (a C++ build on the first run
   of a compiled function), is :func:`announce`\\ d *before* it starts: an ``INFO``
   record on the ``lazyx`` logger. So that it is seen without any configuration, it
   is also written as one ``lazyx: ...`` line to stderr when nobody configured
   logging: ``LAZYX_LOG`` unset and no handler between the ``lazyx`` logger and the
   root (the case where :mod:`logging` itself falls back to ``lastResort`` for
   warnings). An application that configured logging gets the record through its
   own handlers and levels, and ``LAZYX_LOG=warning`` silences it.
3. Details (each build, its time, background work the user does not wait for) are
   ``DEBUG`` or plain ``INFO`` records: visible with ``LAZYX_LOG=debug``/``info``.

**Warnings.** :func:`warn` computes ``stacklevel`` by walking out of lazyx's own
frames (modules ``lazyx`` and ``lazyx.*``, the compiled plans lazyx generates, and
the import machinery while lazyx is imported), so a warning points at the line of the user's code that
led to it however deep inside lazyx it was raised.
"""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = ["logger", "LEVELS", "configure", "announce", "warn", "user_stacklevel"]

#: The logger of lazyx (``logging.getLogger("lazyx")``).
logger = logging.getLogger("lazyx")
logger.addHandler(logging.NullHandler())

#: The values of ``LAZYX_LOG`` and the level each sets.
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_FORMAT = "lazyx: %(message)s"

_handler: logging.Handler | None = None


def configure(value: str | None = None) -> None:
    """Apply ``LAZYX_LOG`` (or ``value``): a stderr handler on the ``lazyx`` logger at
    that level. Called by ``import lazyx`` when the variable is set; again, it only
    changes the level of the handler it attached the first time."""
    global _handler
    from .environment import read_variable  # (imported with logging: LAZYX_LOG is set)
    # A value lazyx does not accept is a warning there, naming these levels.
    text = read_variable("LAZYX_LOG", environ=None if value is None else {"LAZYX_LOG": value})
    if not text:
        return
    level = LEVELS[text]
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(_handler)
    _handler.setLevel(level)
    logger.setLevel(level)


def _configured() -> bool:
    """Whether someone decided where lazyx's records go: ``LAZYX_LOG`` or any handler
    (other than lazyx's own NullHandler) on the way from the ``lazyx`` logger to the root."""
    if _handler is not None:
        return True
    log = logger
    while log is not None:
        if any(type(h) is not logging.NullHandler for h in log.handlers):
            return True
        if not log.propagate:
            break
        log = log.parent
    return False


def announce(message: str, *args) -> None:
    """Say, before it starts, what long work (more than about a second) lazyx does now:
    an ``INFO`` record, shown on stderr even when logging is not configured."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(message, *args)
    elif not _configured():
        sys.stderr.write(_FORMAT % {"message": message % args if args else message} + "\n")
        sys.stderr.flush()


def _internal(frame) -> bool:
    """A frame of lazyx: its modules and the plans it generates (``<lazyx ...>``)."""
    name = frame.f_globals.get("__name__") or ""
    return (name == "lazyx" or name.startswith("lazyx.")
            or frame.f_code.co_filename.startswith("<lazyx"))


def _importlib(frame) -> bool:
    """A frame of the import machinery, which :func:`warnings.warn` skips without
    counting it (so a warning raised while lazyx is imported names the import line)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a :func:`warnings.warn` in the caller of this
    function name the first frame outside lazyx (the caller's own when it is outside)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and (_internal(frame) or _importlib(frame)):
        frame = frame.f_back
        if not _importlib(frame):
            level += 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """:func:`warnings.warn` pointing at the user's line (see the module docstring)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
